"""The GPU session's figures in one JSON file and one markdown table.

    python tools/gpu/report.py OUT

reads what `tools/gpu/gpu_session.sh` left in OUT (`env.json`, `phases.tsv`, `gpu-check.txt`,
`zero2.json`, `zero3.json`, `shape-<backbone>.json`) and writes `OUT/gpu_figures.json` (all of it)
and `OUT/gpu_table.md` (the tables docs/launching.md and the README take their figures from),
then prints the markdown. Every model in it has random weights, and the tables say so.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from shapes import BACKBONES

DIFFERS = 0.25  # a recipe's hours are to be corrected where the measurement is off by more than this
RANDOM_NOTE = ("**Every model here has random weights**: the backbones' architectures (tools/gpu/shapes/), SmolLM2's "
               "tokenizer with the real vocabulary size, conversations from actions-gen. MFU counts c·N FLOPs per "
               "token position run (padding included; c = 6 full fine-tuning, 4 LoRA, +2 gradient checkpointing, 2 "
               "forward only) against the GPU's dense bf16 peak; the recipes' hours are their 8 x A100 compute at "
               "the measured MFU (rollouts at the recipes' vLLM assumption).")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def collect(out: Path) -> dict:
    phases = []
    if (out / "phases.tsv").is_file():
        for line in (out / "phases.tsv").read_text(encoding="utf-8").splitlines():
            parts = line.split("\t")
            if len(parts) >= 4:
                phases.append({"phase": parts[0], "status": parts[1], "seconds": float(parts[2] or 0),
                               "detail": parts[3]})
    checks = []
    if (out / "gpu-check.txt").is_file():
        checks = [ln for ln in (out / "gpu-check.txt").read_text(encoding="utf-8").splitlines()
                  if ln.split(" ", 1)[0] in ("PASS", "FAIL", "SKIP")]
    shapes = {}
    for backbone in BACKBONES:
        figures = _read_json(out / f"shape-{backbone}.json")
        if figures is not None:
            shapes[backbone] = figures
    return {"env": _read_json(out / "env.json") or {}, "phases": phases, "gpu_check": checks,
            "zero": {stage: z for stage in ("2", "3") if (z := _read_json(out / f"zero{stage}.json")) is not None},
            "shapes": shapes}


def _num(x: Any, fmt: str = "{:,.0f}") -> str:
    return "-" if x is None else fmt.format(x)


def _pct(x: Any) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def markdown(data: dict) -> str:
    env = data["env"]
    gpu = env.get("gpu") or "no GPU"
    versions = ", ".join(f"{k} {env[k]}" for k in ("torch", "cuda", "transformers", "accelerate", "peft", "deepspeed")
                         if env.get(k))
    lines = [f"# GPU session: {gpu}" + (f" ({env['gpu_memory_gib']:.0f} GiB)" if env.get("gpu_memory_gib") else ""),
             "", f"{versions}; {env.get('date', '')}".strip("; "), "",
             RANDOM_NOTE, ""]
    rows = []
    for backbone, figures in data["shapes"].items():
        for stage, s in figures.get("stages", {}).items():
            if not s.get("ok"):
                rows.append(f"| {backbone} | {stage} | {s.get('engine', '-')} | {s.get('layers', '-')} of "
                            f"{figures.get('full_layers', '-')} | FAILED: {s.get('error', '?')[:120]} |||||||||")
                continue
            ratio = s.get("recomputed_vs_recipe")
            flag = "-" if ratio is None else ("**yes**" if abs(ratio - 1) > DIFFERS else "no")
            batch = f"{s['micro_batch_size']} x {s['grad_accum_steps']}"
            rate = s.get("tokens_per_s") if stage == "sft" else s.get("phases", {}).get("student", {}).get(
                "positions_per_s")
            rows.append(
                f"| {backbone} | {stage} | {s['engine']} | {s['layers']} of {figures['full_layers']} | {batch} | "
                f"{s.get('lora_r') or 'full'} | {'on' if s.get('gradient_checkpointing') else 'off'} | "
                f"{_num(rate)} | {_pct(s.get('mfu'))} | {_num(s.get('peak_memory_gib'), '{:.1f}')} | "
                f"{_num(s['recipe']['compute_hours'], '{:.3g}')} | {_num(s.get('recomputed_compute_hours'), '{:.3g}')} "
                f"| {flag} |")
    if rows:
        lines += ["## The backbone recipes' shapes, one GPU", "",
                  ("| backbone | stage | engine | layers run | micro-batch x accum | LoRA r | grad. ckpt | tokens/s | MFU "
                   "| peak GiB | recipe compute h | recomputed h | differs > 25% |"),
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|", *rows, "",
                  ("tokens/s: SFT, real tokens per second of whole steps; VASD, the student pass's token positions "
                   "per second. Layers below the backbone's: the full model does not fit one GPU under that engine "
                   "(the recipe shards it over 8)."), ""]
    vasd = []
    for backbone, figures in data["shapes"].items():
        s = figures.get("stages", {}).get("vasd")
        if not s or not s.get("ok"):
            continue
        p, d = s.get("phases", {}), s.get("decode") or {}
        vasd.append(f"| {backbone} | {_num(s.get('step_s'), '{:.1f}')} | "
                    f"{_num(p.get('rollouts', {}).get('seconds_per_step'), '{:.1f}')} | "
                    f"{_pct(p.get('rollouts', {}).get('mfu'))} | {_pct(p.get('teacher', {}).get('mfu'))} | "
                    f"{_pct(p.get('student', {}).get('mfu'))} | {_num(d.get('mean_rows'), '{:.0f}')} | "
                    f"{_num(d.get('forward_tokens_per_s'))} | {_num(s.get('rollout_tokens_per_s'))} | "
                    f"{_num(d.get('roofline_tokens_per_s'))} | {_pct(d.get('rollout_share_of_roofline'))} | "
                    f"{_num(s.get('recomputed_compute_hours_hf_rollouts'), '{:.3g}')} |")
    if vasd:
        lines += ["## VASD's phases and the HF rollout backend", "",
                  ("| backbone | step s | rollout s | rollout MFU (HF) | teacher MFU | student MFU | decoding rows | "
                   "decode tokens/s (forwards) | rollout tokens/s (all) | bf16 roofline tokens/s | share of roofline | "
                   "recipe h with HF rollouts |"), "|---|---|---|---|---|---|---|---|---|---|---|---|", *vasd, "",
                  ("The roofline: every decoding step reads every bf16 weight once, rows x bandwidth / (2 x N) tokens "
                   "per second. Rollout tokens/s counts the generated tokens over the whole rollout phase (prompt "
                   "reading, sampling and the Python loop included)."), ""]
    zero = []
    for stage, z in data["zero"].items():
        for method, r in z.get("methods", {}).items():
            losses = r.get("losses") or []
            loss = f"{losses[0]:.4f} -> {losses[-1]:.4f}" if losses else "-"
            after = ("identical" if r.get("identical") else _num(r.get("max_rel_diff"), "max rel. diff {:.2g}")) \
                if r.get("max_rel_diff") is not None else "-"
            fmt = "DeepSpeed" if (r.get("checkpoint") or {}).get("deepspeed_format") else "Accelerate"
            zero.append(f"| ZeRO-{stage} | {method} | {z.get('launcher')} | {len(losses)} | {loss} | "
                        f"{len(losses) // 2 or '-'} | {after} | {fmt if r.get('checkpoint') else '-'} | "
                        f"{'PASS' if r.get('ok') else 'FAIL: ' + str(r.get('error', ''))[:100]} |")
    if zero:
        lines += ["## DeepSpeed ZeRO-2 and ZeRO-3 on one process, with resume", "",
                  ("| stage | method | launcher | steps | loss | resumed from step | losses after the resume vs "
                   "uninterrupted | checkpoint | result |"), "|---|---|---|---|---|---|---|---|---|", *zero, "",
                  ("VASD under ZeRO-2: full fine-tuning with the frozen teacher copy; under ZeRO-3: LoRA, the teacher "
                   "the adapter-free model."), ""]
    if data["gpu_check"]:
        lines += ["## tools/gpu/gpu_check.sh (WEIGHTS=random)", "", "```", *data["gpu_check"], "```", ""]
    if data["phases"]:
        lines += ["## Phases", "", "| phase | result | seconds | detail |", "|---|---|---|---|",
                  *[f"| {p['phase']} | {p['status']} | {p['seconds']:.0f} | {p['detail'][:160]} |"
                    for p in data["phases"]], ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python tools/gpu/report.py OUT", file=sys.stderr)
        return 2
    out = Path(argv[0])
    data = collect(out)
    (out / "gpu_figures.json").write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    text = markdown(data)
    (out / "gpu_table.md").write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
