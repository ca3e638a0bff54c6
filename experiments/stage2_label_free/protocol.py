"""Issue 55's protocol: label-free stage 2 on functions without gold, against self-training.

    python protocol.py gate --out OUT                 # read the gate's five evaluations (gate.sh runs them)
    python protocol.py prepare --run RUN --out OUT    # the arms' configs and commands (arms.sh), the rule frozen
    python protocol.py mix --self A --seen B --out C  # C2's corpus: self-labels and seen-function rows, 1:1
    python protocol.py steps --budget-s S --calibration A B  # SFT steps that take S CPU seconds (A, B: CPU s of 2 and 22 steps;
                                                             # --less-held-out V: less V's held-out measuring)
    python protocol.py pilot --out OUT                # seed 0 of V and C2 against S and each other, the pilot's rule
    python protocol.py choose --out OUT --arm c2      # a control's rate: the best of its seed-0 runs on B-dev
    python protocol.py report --out OUT               # every arm so far: P, premature, never answered, paired differences
    python protocol.py decide --out OUT               # the rule applied to the arms' B-dev evaluations
    python protocol.py btest --out OUT                # the rule's last clause on B-test, read once after decide (btest.sh)
    python protocol.py keep --out OUT --s S           # what the figures are read from, into records/ (commit it)
    python protocol.py restore --out OUT --s S        # records/ back into OUT, for a rebuilt S with the same weights

The decision rule (`RULE`) is written here, before any arm's row exists; `prepare` copies it with
its hash into OUT/arms/rule.json, and `decide` refuses a rule that changed since.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import random
import sys
from pathlib import Path

import yaml

from fic.core.errors import FicError
from fic.core.files import atomic_open, write_json, write_jsonl, write_text
from fic.core.records import read_log, read_records
from fic.core.stats import mean_interval
from fic.evaluation.gap import gate, scores_by_id, view_gap
from fic.evaluation.metrics import first_answer_score, timing_bin
from fic.training.curves import read_metrics

HERE = Path(__file__).resolve().parent
# What the figures are read from, kept in the repository: the machine and its runs/ were replaced
# twice between sessions, taking every evaluation log with them (experiments/LOG.md, 2026-12-06 and
# 2026-12-07).
RECORDS = HERE / "records"
# An SFT arm's CPU seconds a step: two short runs of its own config, alone on the machine like V's
# run, their difference (start-up cancels). Not S's stage-1 average: CPU seconds a step move with the
# load a run shares the machine with (stage 1 took 15.0 for the old S, 26.7 for the rebuilt one; C2's
# config alone 29.6), so a rate from another load than V's buys the control the wrong number of steps
# (experiments/LOG.md, 2026-12-06, fifth session).
CALIBRATION_STEPS = (2, 22)
GATE_THRESHOLDS = {"bdev_own_gap": 8.0, "btrain_teacher_student_gap": 8.0}  # points
# The gate's evaluations: name -> (folder under OUT, teacher log, student log)
GATE_LOGS = {"bdev_own_gap": ("bdev", "bdev"), "btrain_teacher_student_gap": ("btrain-full", "btrain-sharded"),
             "seen_teacher_student_gap": ("seen-full", "seen-sharded")}

# Written 2026-12-05, before any arm trained (issue 55). Points are P (0-100) on B-dev, N = 512, float32.
RULE = {
    "pilot": "seed 0 of V and C2 first: continue to seeds 1 and 2 only if V beats S by >= 3 points on B-dev; "
             "otherwise run H next and report which reading holds",
    "win": ["V - C2 > 0 in every seed (sharded P on B-dev)",
            "mean over seeds of V - C2 >= 3 points",
            "McNemar exact p < 0.05 for V vs C2 in at least 2 of 3 seeds",
            "V - S > 0 in every seed",
            "P(full) of V on B-dev and on the seen-function dev set within 2 points of C2's and of S's",
            "then one read of B-test: V - C2 > 0 (mean over seeds)"],
    "convincing_negative": ["the gate passed", "H - S >= 5 points on B-dev",
                            "V's held-out divergence fell by >= 30%",
                            "the seed-level 95% upper bound of V - C2 < 3 points"],
    "min_win": 3.0, "max_p": 0.05, "p_seeds": 2, "full_margin": 2.0, "h_min": 5.0,
}
# Numbers the rule's text above states and its keys do not hold (a new key would change the frozen hash).
DIVERGENCE_FALL = 0.30  # "V's held-out divergence fell by >= 30%"
NEGATIVE_BOUND = 3.0  # "the seed-level 95% upper bound of V - C2 < 3 points"
# The controls' learning rates; each control's is chosen on B-dev at the first seed (`choose`).
RATES = ["3.0e-5", "1.0e-4", "2.0e-4"]


def rule_hash(rule: dict = RULE) -> str:
    return hashlib.sha256(json.dumps(rule, sort_keys=True).encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------- the gate

def gate_report(out: Path) -> dict:
    """Each gap the gate measures, from whichever evaluations have finished."""
    gaps, progress = {}, {}
    for name, (teacher, student) in GATE_LOGS.items():
        logs = [read_log(out / folder / "conversations.jsonl") for folder in (teacher, student)]
        expected = [_expected(out / folder) for folder in (teacher, student)]
        done = [len(log) for log in logs]
        if teacher == student:  # one evaluation holds both views
            done, expected = done[:1], expected[:1]
        progress[name] = f"{sum(done)} of {sum(expected)} conversations"
        if all(d and d == e for d, e in zip(done, expected)):
            gaps[name] = view_gap(logs[0], logs[1], origin=str(out / teacher))
    verdict = gate(gaps, GATE_THRESHOLDS) if all(name in gaps for name in GATE_THRESHOLDS) else None
    return {"gaps": gaps, "progress": progress, "thresholds": GATE_THRESHOLDS, "verdict": verdict}


def _expected(folder: Path) -> int:
    """Conversations an evaluation folder will hold: its instances times its views."""
    config = folder / "config.yaml"
    if not config.exists():
        return 0
    cfg = yaml.safe_load(config.read_text())
    (source,) = cfg["data"]["source"]
    return len(read_records(source.removeprefix("jsonl:"))) * len(cfg["views"]) * cfg["runs"]


def gate_markdown(report: dict) -> str:
    lines = ["| gap | N | teacher view P | student view P | gap (95% CI) | better / worse | p | student premature | "
             "student never answered |", "|---|---|---|---|---|---|---|---|---|"]
    for name in GATE_LOGS:
        gap = report["gaps"].get(name)
        if gap is None:
            lines.append(f"| {name} | not finished ({report['progress'][name]}) | | | | | | | |")
            continue
        lines.append(f"| {name} | {gap['n']} | {gap['first']:.1f} | {gap['second']:.1f} | {gap['difference']:+.1f} "
                     f"({gap['low']:+.1f} to {gap['high']:+.1f}) | {gap['better']} / {gap['worse']} | "
                     f"{gap['p_value']:.2g} | {gap['student_premature_rate']:.1f}% | "
                     f"{gap['student_never_answered_rate']:.1f}% |")
    verdict = report["verdict"]
    lines.append("")
    lines.append("gate: " + ("not decided yet" if verdict is None else
                             ("PASSED" if verdict["passed"] else "FAILED") + " (" + ", ".join(
                                 f"{k} {c['difference']:+.1f} vs {c['threshold']:.0f}"
                                 for k, c in verdict["checks"].items()) + ")"))
    return "\n".join(lines)


# ---------------------------------------------------------------------------- the arms

def fill(template: Path, **values: object) -> str:
    text = template.read_text()
    for key, value in values.items():
        text = text.replace("{" + key + "}", str(value))
    return text


def prepare(run: Path, out: Path, seeds: list[int], v_steps: int, lrs: list[str] = RATES,
            pilot_lr: str = "1.0e-4", records: Path = RECORDS) -> Path:
    """OUT/arms: the filled configs, rule.json, arms.sh (every arm, in order), pilot.sh (seed 0 of V
    and of C2 at `pilot_lr`, and their evaluations) and btest.sh (the one B-test read); nothing is
    run. The scripts run one command at a time and resume: a finished step is passed over, a training
    run with a checkpoint continues from it; each arm's evaluations end with `keep` into `records`."""
    arms = out / "arms"
    configs = arms / "configs"
    configs.mkdir(parents=True, exist_ok=True)
    write_json(arms / "rule.json", {"rule": RULE, "hash": rule_hash()})
    evals = {"bdev": f"{out}/B/dev.jsonl", "btest": f"{out}/B/test.jsonl", "seen-dev": f"{run}/data/dev.jsonl"}
    base = yaml.safe_load((HERE / "eval.yaml").read_text())
    for name, data in evals.items():
        cfg = {**base, "model": {**base["model"], "model": f"{run}/sft/final"}, "data": {**base["data"],
               "source": f"jsonl:{data}"}, "out": f"{arms}/eval/{name}"}
        write_text(configs / f"eval-{name}.yaml", yaml.safe_dump(cfg, sort_keys=False))
    write_text(configs / "c2-data.yaml", fill(HERE / "configs" / "c2-data.yaml", run=run, out=out))
    # A VASD seed draws its rollout prompts and anchors too (data.seed), as a control's seed draws its
    # corpus order; seed + 1 keeps seed 0 on VASD's default draw (data.seed 1), the one V seed 0 and H ran.
    for seed in seeds:
        write_text(configs / f"v-s{seed}.yaml", fill(HERE / "configs" / "v.yaml", run=run, out=out, seed=seed,
                                                     data_seed=seed + 1, steps=v_steps))
    write_text(configs / "h-s0.yaml", fill(HERE / "configs" / "h.yaml", run=run, out=out, seed=0, data_seed=1, steps=v_steps))
    me = f"python {HERE / 'protocol.py'}"
    short, long = CALIBRATION_STEPS
    # CPU seconds of the children a command ran (cutime + cstime of the shell that waits for it: its
    # $BASHPID, read outside the command substitution, whose own subshell has no children), by label;
    # a resumed run adds a line, and a label's seconds are their sum.
    helpers = ('cpu() { awk -v hz="$(getconf CLK_TCK)" \'{print ($16 + $17) / hz}\' "/proc/$1/stat"; }\n'
               f'timed() {{ local label=$1 me=$BASHPID t; shift; t=$(cpu $me); "$@"; '
               f'echo "$label $(echo "$(cpu $me) - $t" | bc)" >> {arms}/times.tsv; }}\n'
               f'spent() {{ awk -v l="$1" \'$1 == l {{s += $2}} END {{print s + 0}}\' {arms}/times.tsv; }}\n'
               '# once MADE CMD...: CMD unless MADE exists (a finished step of an earlier attempt)\n'
               'once() { local made=$1; shift; if [ -e "$made" ]; then echo "done before: $made"; else "$@"; fi; }\n'
               '# train LABEL OUT CMD...: timed, then its weights hash written; passed over when the hash is there\n'
               '# (restored from records/ too, where the weights themselves are gone), resumed from a checkpoint\n'
               'train() {\n'
               '  local label=$1 out=$2; shift 2\n'
               '  if [ -e "$out/weights.sha256" ]; then echo "done before: $out"; return; fi\n'
               '  if compgen -G "$out/checkpoints/step-*/complete" > /dev/null; then set -- "$@" resume=true; fi\n'
               '  timed "$label" "$@"\n'
               '  sha256sum < "$out/final/model.safetensors" | cut -d" " -f1 > "$out/weights.sha256"\n'
               '}\n'
               '# evaluate FOLDER CMD...: CMD unless FOLDER holds a whole log (the model it read may be gone)\n'
               f'evaluate() {{ local folder=$1; shift; if {me} finished "$folder"; then echo "done before: $folder"; '
               'else "$@"; fi; }\n'
               f'# calibrate NAME CONFIG: {short} and {long} steps of an SFT arm\'s config into scratch folders, timed '
               'as cal-NAME-STEPS (once: a label in times.tsv is a finished run)\n'
               'calibrate() {\n'
               f'  local name=$1 cfg=$2 n; for n in {short} {long}; do\n'
               f'    grep -q "^cal-$name-$n " {arms}/times.tsv 2>/dev/null && continue\n'
               f'    rm -rf {arms}/calibrate/$name-$n\n'
               f'    timed cal-$name-$n fic train sft --config "$cfg" train.max_steps=$n out={arms}/calibrate/$name-$n\n'
               '  done\n'
               '}')
    head = ["#!/usr/bin/env bash", f"# Rule {rule_hash()} frozen in {arms}/rule.json before any arm was read.",
            "set -euo pipefail", helpers, f"S={run}/sft/final", f"mkdir -p {arms}/eval {arms}/eval-seen", ""]
    blind = ["# Blinding: B-train's answers replaced by S's own calls before any label-free arm reads them.",
             f"once {arms}/b-train.blind.jsonl timed label-blind fic self-label --model $S --source "
             f"jsonl:{out}/B/train.jsonl --keep any-call --out {arms}/b-train.blind.jsonl"]
    # Keep checked, not agreeing: S (trained to defer) asks a question in the concat view of every
    # B-train prompt, so agreement kept 0 of 600 in the pilot (experiments/LOG.md, 2026-12-06).
    c2_corpus = ["# C2's corpus: S's filtered calls on B-train as deferral conversations, mixed 1:1 with the seen ones",
                 f"once {arms}/b-train.self.jsonl timed label-self fic self-label --model $S --source "
                 f"jsonl:{out}/B/train.jsonl --keep checked --out {arms}/b-train.self.jsonl",
                 f"once {arms}/c2.self.sft.jsonl fic sft-data --config {configs}/c2-data.yaml",
                 f"once {arms}/c2.mix.sft.jsonl {me} mix --self {arms}/c2.self.sft.jsonl --seen {run}/data/sft.sft.jsonl "
                 f"--out {arms}/c2.mix.sft.jsonl"]
    ev = f"fic eval --config {configs}/eval-bdev.yaml --quiet views=[full,sharded]"
    seen = f"fic eval --config {configs}/eval-seen-dev.yaml --quiet views=[full]"
    s_bdev = [f"once {arms}/eval/s cp -r {out}/bdev {arms}/eval/s  # S on B-dev is the gate's evaluation (same settings):",
              f"{ev} model.model=$S out={arms}/eval/s  # resumed, its fingerprint checked: nothing left to play"]

    keep_now = f"{me} keep --out {out} --s $S --records {records}  # commit them: they outlive the machine"

    def evaluated(name: str) -> list[str]:
        return [f"evaluate {arms}/eval/{name} {ev} model.model={arms}/{name}/final out={arms}/eval/{name}",
                f"evaluate {arms}/eval-seen/{name} {seen} model.model={arms}/{name}/final out={arms}/eval-seen/{name}",
                keep_now]

    def v_arm(seed: int) -> list[str]:
        return [f"train v-s{seed} {arms}/v-s{seed} fic train vasd --config {configs}/v-s{seed}.yaml"]

    corpora = {"c2": f"{arms}/c2.mix.sft.jsonl", "c1": f"{run}/data/sft.sft.jsonl"}
    for name, arm_seeds in (("c2", seeds), ("c1", seeds[:1])):  # C1: one seed (issue 55)
        for seed in arm_seeds:
            for lr in sorted({*lrs, pilot_lr}):
                write_text(configs / f"{name}-lr{lr}-s{seed}.yaml",
                           fill(HERE / "configs" / "sft.yaml", run=run, out=out, seed=seed, lr=lr,
                                corpus=corpora[name], name=name, steps=1))

    def sft_arm(name: str, lr: str, seed: int) -> list[str]:
        """C2 or C1 at rate `lr` (a literal or the shell variable `choose` set) for V's CPU seconds
        (less V's held-out measuring; C2's also less the self-labelling) at the arm's own CPU seconds
        a step, calibrated first (once per corpus: a later arm finds the labels), then evaluated."""
        cfg, arm = configs / f"{name}-lr{lr}-s{seed}.yaml", f"{name}-lr{lr}-s{seed}"
        budget = f'$(echo "$(spent v-s{seed}) - $(spent label-self)" | bc)' if name == "c2" else f"$(spent v-s{seed})"
        return [f"calibrate {name} {cfg}",
                f"STEPS=$({me} steps --budget-s {budget} --less-held-out {arms}/v-s{seed} "
                f"--calibration $(spent cal-{name}-{short}) $(spent cal-{name}-{long}))",
                f"train {arm} {arms}/{arm} fic train sft --config {cfg} train.max_steps=$STEPS", *evaluated(arm)]

    rates = " ".join(lrs)
    first, later = seeds[0], seeds[1:]
    sh = [*head, "# Issue 55's arms, written by protocol.py prepare; pilot.sh first (seed 0 of V and C2).",
          *blind, *c2_corpus, *s_bdev, f"{seen} model.model=$S out={arms}/eval-seen/s", "",
          "# V in every seed first: its settings are the demo's stage 2, nothing here is chosen for it."]
    for seed in seeds:
        sh += [*v_arm(seed), *evaluated(f"v-s{seed}")]
    sh += ["", f"# C2 at every rate in seed {first}; the rate with the best sharded P on B-dev (a tie: the first "
           "listed) runs the other seeds. Chosen on the data V is compared on: the control's advantage; "
           "B-test, read once, is free of it."]
    for lr in lrs:
        sh += sft_arm("c2", lr, first)
    sh.append(f"C2_RATE=$({me} choose --out {out} --arm c2 --seed {first} --lrs {rates})")
    for seed in later:
        sh += sft_arm("c2", "$C2_RATE", seed)
    # H before C1's rates: the positive control tells more than a control's rate sweep
    sh += ["", "# H, one seed: the hinted teacher reads B-train's true gold (the positive control).",
           f"train h-s0 {arms}/h-s0 fic train vasd --config {configs}/h-s0.yaml", *evaluated("h-s0")]
    sh += ["", "# C1, one seed, its rate chosen the same way (decide reads the choice again)."]
    for lr in lrs:
        sh += sft_arm("c1", lr, first)
    sh += ["", f"{me} report --out {out} --seeds {' '.join(map(str, seeds))} --lrs {rates}",
           f"{me} decide --out {out} --seeds {' '.join(map(str, seeds))} --lrs {rates}", "",
           f"# Each loss term's gradient norm: V seed {first} again with logging.term_grad_norms_every=4 and no held-out",
           "# measuring (neither changes an update: its weights must equal V's, so the norms are V's own).",
           f"train v-s{first}-norms {arms}/v-s{first}-norms fic train vasd --config {configs}/v-s{first}.yaml "
           f"out={arms}/v-s{first}-norms logging.term_grad_norms_every=4 dev.every=0",
           f"cmp {arms}/v-s{first}/weights.sha256 {arms}/v-s{first}-norms/weights.sha256 "
           f"&& echo \"v-s{first}-norms: the same weights as v-s{first}\""]
    write_text(arms / "arms.sh", "\n".join(sh) + "\n")
    (arms / "arms.sh").chmod(0o755)

    # The rule's last clause reads B-test once, after decide: a script of its own, which refuses to
    # start before decision.json exists (dev speaks first).
    bt = f"fic eval --config {configs}/eval-btest.yaml --quiet views=[full,sharded]"
    btest = [*head, "# The one B-test read: S, V and C2 at its chosen rate in every seed, each once; B-test chose nothing.",
             f'[ -e {arms}/decision.json ] || {{ echo "B-test is read after decide: run arms.sh to its end first" >&2; exit 2; }}',
             f"mkdir -p {arms}/eval-btest",
             f"C2_RATE=$({me} choose --out {out} --arm c2 --seed {first} --lrs {rates})",
             f"evaluate {arms}/eval-btest/s {bt} model.model=$S out={arms}/eval-btest/s"]
    for seed in seeds:
        btest += [f"evaluate {arms}/eval-btest/{name} {bt} model.model={arms}/{name}/final out={arms}/eval-btest/{name}"
                  for name in (f"v-s{seed}", f"c2-lr$C2_RATE-s{seed}")]
    btest += [keep_now, f"{me} btest --out {out} --seeds {' '.join(map(str, seeds))} --lrs {rates}"]
    write_text(arms / "btest.sh", "\n".join(btest) + "\n")
    (arms / "btest.sh").chmod(0o755)

    seed, report = seeds[0], f"{me} pilot --out {out} --seed {seeds[0]} --lr-c2 {pilot_lr}"
    # One command at a time: two torch processes on 2 cores ran 5 times slower together than in turn
    # (each one's threads wait on the other's), so lanes side by side bought nothing.
    pilot = [*head, f"# Issue 55's pilot: seed {seed} of V first (the pilot's rule reads V against S), C2's corpus, "
             f"V's evaluations, then C2 (rate {pilot_lr}: its step calibration, training and evaluations). "
             "Continue to arms.sh only if V beats S by >= 3 points on B-dev.",
             *blind, *s_bdev, *v_arm(seed), *c2_corpus, "",
             f"evaluate {arms}/eval/v-s{seed} {ev} model.model={arms}/v-s{seed}/final out={arms}/eval/v-s{seed}", report,
             f"evaluate {arms}/eval-seen/v-s{seed} {seen} model.model={arms}/v-s{seed}/final out={arms}/eval-seen/v-s{seed}",
             f"{seen} model.model=$S out={arms}/eval-seen/s",
             *sft_arm("c2", pilot_lr, seed), report]
    write_text(arms / "pilot.sh", "\n".join(pilot) + "\n")
    (arms / "pilot.sh").chmod(0o755)
    return arms / "arms.sh"


def calibrated_steps(budget_s: float, short_s: float, long_s: float, steps: tuple[int, int] = CALIBRATION_STEPS) -> int:
    """SFT steps that take `budget_s` CPU seconds, at the CPU seconds a step of two runs of `steps`
    steps that took `short_s` and `long_s` (their difference: the steps alone, start-up cancelled)."""
    per_step = (long_s - short_s) / (steps[1] - steps[0])
    if per_step <= 0:
        raise ValueError(f"calibration: {steps[1]} steps took {long_s} CPU s, no more than {steps[0]} steps' "
                         f"{short_s}: rerun it on a quiet machine")
    return max(1, round(budget_s / per_step))


def held_out(run: Path) -> dict:
    """A VASD run's held-out figures from its metrics.jsonl: the divergence per answer token by step
    (the first is before training), its fall (1 - last / first), and the CPU seconds the measuring
    took (every line: a resumed run's repeated steps cost twice, as its timed CPU seconds do)."""
    rows = [r for r in read_metrics(run / "metrics.jsonl") if "dev_divergence_per_token" in r]
    curve = [[r["step"], r["dev_divergence_per_token"]] for r in rows]
    fall = 1.0 - curve[-1][1] / curve[0][1] if len(curve) >= 2 and curve[0][1] else None
    return {"curve": curve, "fall": fall, "cpu_s": sum(r.get("held_out_cpu_s", 0.0) for r in rows)}


def rollout_blocks(run: Path, every: int = 8) -> list[dict]:
    """A VASD run's rollouts by blocks of `every` steps: the mean rollout accuracy (for a label-free
    arm, agreement with the starting model's own full-view call, the blinded label) and premature-
    answer rate (%) over the steps of each block (a resumed run's repeated step counted once)."""
    steps = {r["step"]: r for r in read_metrics(run / "metrics.jsonl") if r.get("step", 0) > 0 and "rollout_accuracy" in r}
    blocks = []
    for end in range(every, max(steps, default=0) + 1, every):
        block = [steps[s] for s in range(end - every + 1, end + 1) if s in steps]
        blocks.append({"steps": f"{end - every + 1}-{end}", **{
            key: 100.0 * sum(r[key] for r in block) / len(block) for key in ("rollout_accuracy", "premature_answer_rate")}})
    return blocks


def mix(self_corpus: Path, seen_corpus: Path, out: Path, seed: int = 0) -> int:
    """Every self-labelled conversation and as many seen-function ones (V's anchor share, 0.5), shuffled."""
    own, seen = read_records(self_corpus), read_records(seen_corpus)
    rng = random.Random(seed)
    rows = own + rng.sample(seen, min(len(own), len(seen)))
    rng.shuffle(rows)
    return write_jsonl(out, rows)


# ---------------------------------------------------------------------------- the pilot

def finished_log(folder: Path) -> list[dict] | None:
    """An evaluation's conversations once every one is played, else None."""
    log = read_log(folder / "conversations.jsonl")
    return log if log and len(log) == _expected(folder) else None


def view_p(log: list[dict], view: str, origin: str = "log") -> float:
    """P (0-100) of an evaluation log's `view`: the mean score of its conversations."""
    played = scores_by_id(log, view, origin=origin).values()
    return 100.0 * sum(r["score"] for r in played) / len(played)


def compare(out: Path, names: dict[str, str], pairs: list[tuple[str, str]], kind: str = "eval",
            seen_kind: str | None = "eval-seen") -> dict:
    """Models (label -> evaluation folder under OUT/arms/`kind`, B-dev unless told, and `seen_kind`)
    from whichever evaluations have finished, and the paired sharded differences of `pairs` among them."""
    bdev = {m: finished_log(out / "arms" / kind / f) for m, f in names.items()}
    seen = {m: None if seen_kind is None else finished_log(out / "arms" / seen_kind / f) for m, f in names.items()}
    models = {}
    for model, log in bdev.items():
        if log is None:
            continue
        sharded = list(scores_by_id(log, "sharded").values())
        models[model] = {"n": len(sharded), "full": view_p(log, "full"), "sharded": view_p(log, "sharded"),
                         "premature": 100.0 * sum(bool(r.get("premature_answer")) for r in sharded) / len(sharded),
                         "never_answered": 100.0 * sum(timing_bin(r) == "never" for r in sharded) / len(sharded),
                         "first_answer": 100.0 * sum(first_answer_score(r) for r in sharded) / len(sharded),
                         "seen_full": None if seen[model] is None else view_p(seen[model], "full")}
    paired = {f"{a} - {b}": view_gap(bdev[a], bdev[b], teacher_view="sharded", origin=str(out / "arms" / kind))
              for a, b in pairs if bdev[a] is not None and bdev[b] is not None}
    # retention: the same pairs' P(full) on the seen-function dev set, paired too
    seen_paired = {f"{a} - {b}": view_gap(seen[a], seen[b], teacher_view="full", student_view="full",
                                          origin=str(out / "arms" / str(seen_kind)))
                   for a, b in pairs if seen[a] is not None and seen[b] is not None}
    where = {"eval": "B-dev", "eval-btest": "B-test"}[kind]
    return {"models": models, "pairs": paired, "seen_pairs": seen_paired,
            "not_finished": sorted([f"{m} on {where}" for m in names if bdev[m] is None]
                                   + [f"{m} on the seen dev set" for m in names if seen_kind and seen[m] is None])}


def pilot_report(out: Path, seed: int, lr: str) -> dict:
    """Seed `seed` of V and of C2 (rate `lr`) against S and each other on B-dev, from whichever
    evaluations have finished, and the pilot's rule: on to the other seeds only if V beats S by
    RULE["min_win"] points (sharded P on B-dev); otherwise H next."""
    found = compare(out, {"S": "s", "V": f"v-s{seed}", "C2": f"c2-lr{lr}-s{seed}"},
                    [("V", "S"), ("C2", "S"), ("V", "C2")])
    v_s = found["pairs"].get("V - S")
    verdict = None if v_s is None else (
        f"continue: V beats S by {v_s['difference']:+.1f} >= {RULE['min_win']:g} points" if v_s["difference"] >= RULE["min_win"]
        else f"stop: V - S = {v_s['difference']:+.1f} < {RULE['min_win']:g} points; H runs next")
    v_run = out / "arms" / f"v-s{seed}"
    divergence = held_out(v_run) if (v_run / "metrics.jsonl").exists() else None
    return {"seed": seed, "c2_lr": lr, **found, "verdict": verdict, "v_held_out_divergence": divergence}


def comparison_markdown(report: dict, where: str = "B-dev", seen: bool = True) -> list[str]:
    lines = ["| model | N | P(full) | P(sharded) | premature | never answered | first-answer accuracy |"
             + " P(full), seen dev |" * seen, "|---|---|---|---|---|---|---|" + "---|" * seen]
    for model, m in report["models"].items():
        retained = "not finished" if m["seen_full"] is None else f"{m['seen_full']:.1f}"
        lines.append(f"| {model} | {m['n']} | {m['full']:.1f} | {m['sharded']:.1f} | {m['premature']:.1f}% | "
                     f"{m['never_answered']:.1f}% | {m['first_answer']:.1f} |" + f" {retained} |" * seen)
    for title, pairs in ((f"sharded P on {where}", report["pairs"]), ("P(full), seen dev", report.get("seen_pairs", {}))):
        if pairs:
            lines += ["", f"| {title} | N | difference (95% CI) | better / worse | exact p |", "|---|---|---|---|---|"]
        for name, g in pairs.items():
            lines.append(f"| {name} | {g['n']} | {g['difference']:+.1f} ({g['low']:+.1f} to {g['high']:+.1f}) | "
                         f"{g['better']} / {g['worse']} | {g['p_value']:.2g} |")
    return lines


def divergence_line(name: str, divergence: dict | None) -> list[str]:
    if not divergence or divergence["fall"] is None:
        return []
    return [f"{name}'s held-out divergence per answer token: "
            + ", ".join(f"step {step} {value:.4f}" for step, value in divergence["curve"])
            + f" (fell {100 * divergence['fall']:.0f}%; its measuring took {divergence['cpu_s']:.0f} CPU s)"]


def pilot_markdown(report: dict) -> str:
    lines = comparison_markdown(report)
    lines += ["", *divergence_line("V", report.get("v_held_out_divergence"))]
    lines += ["", "pilot: " + (report["verdict"] or "not decided yet (V on B-dev not finished)")]
    if report["not_finished"]:
        lines.append("not finished: " + ", ".join(report["not_finished"]))
    return "\n".join(lines)


def arms_report(out: Path, seeds: list[int], lrs: list[str]) -> dict:
    """Every arm in every seed from whichever evaluations have finished: each V seed against S,
    against C2 at its chosen rate in the same seed and against C1 at its chosen rate (one seed);
    C2 and H against S; every rate C2 and C1 ran in the first seed; V's held-out curves."""
    first, rates = seeds[0], {}
    for arm in ("c2", "c1"):
        try:
            rates[arm] = choose_rate(out, arm, first, lrs)
        except FicError:  # its first seed's rates not all evaluated yet
            rates[arm] = None
    names, pairs = {"S": "s"}, []
    for seed in seeds:
        names[f"V s{seed}"] = f"v-s{seed}"
        pairs.append((f"V s{seed}", "S"))
        if rates["c2"] is not None:
            names[f"C2 s{seed}"] = f"c2-lr{rates['c2']}-s{seed}"
            pairs += [(f"V s{seed}", f"C2 s{seed}"), (f"C2 s{seed}", "S")]
        if rates["c1"] is not None:
            pairs.append((f"V s{seed}", f"C1 s{first}"))
    for arm, label in (("c2", "C2"), ("c1", "C1")):
        for lr in lrs:
            name = f"{label} s{first}" if lr == rates[arm] else f"{label} s{first} lr {lr}"
            names[name] = f"{arm}-lr{lr}-s{first}"
    names["H"] = "h-s0"
    found = compare(out, names, [*pairs, ("H", "S")])
    ran = [seed for seed in seeds if (out / "arms" / f"v-s{seed}" / "metrics.jsonl").exists()]
    report = {"rates": rates, **found, "v_held_out_divergence": {seed: held_out(out / "arms" / f"v-s{seed}") for seed in ran},
              "v_rollouts": {seed: rollout_blocks(out / "arms" / f"v-s{seed}") for seed in ran}}
    return {**report, "seed_level": seed_level(report["pairs"], seeds), "settled": settled(report, seeds)}


def comparator(other: str, seed: int) -> str:
    """The report's label of V's comparator in `seed`: S, or a control at its chosen rate."""
    return "S" if other == "S" else f"{other} s{seed}"


def seed_level(pairs: dict, seeds: list[int]) -> dict:
    """The seed as the unit: for V - S and V - C2 (sharded P, paired within a seed), the mean over the
    seeds measured and its 95% t interval, where at least two are."""
    found = {}
    for other in ("S", "C2"):
        values = [pairs[name]["difference"] for seed in seeds if (name := f"V s{seed} - {comparator(other, seed)}") in pairs]
        if len(values) >= 2:
            found[f"V - {other}"] = mean_interval(values)
    return found


def level_line(name: str, level: dict) -> str:
    return f"{name} over {level['n']} seeds: {level['mean']:+.1f} (t interval {level['low']:+.1f} to {level['high']:+.1f})"


def arms_markdown(report: dict) -> str:
    rates = ", ".join(f"{arm.upper()} {rate or 'not chosen yet'}" for arm, rate in report["rates"].items())
    lines = [f"Rates chosen on B-dev in the first seed: {rates}.", "", *comparison_markdown(report), ""]
    for seed, divergence in report["v_held_out_divergence"].items():
        lines += divergence_line(f"V s{seed}", divergence)
        lines += [f"V s{seed}'s rollouts by steps: " + "; ".join(
            f"{b['steps']} agree {b['rollout_accuracy']:.1f}%, premature {b['premature_answer_rate']:.1f}%"
            for b in report["v_rollouts"][seed])]
    lines += ["", *(level_line(name, level) for name, level in report["seed_level"].items())]
    lines += ["", *settled_markdown(report["settled"])]
    if report["not_finished"]:
        lines += ["", "not finished: " + ", ".join(report["not_finished"])]
    return "\n".join(lines)


def settled_markdown(found: dict) -> list[str]:
    word = {True: "holds", False: "fails", None: "open"}
    lines = ["Settled by the figures so far (no arm still to come can change these):"]
    for part, checks in (("win", found["win"]), ("convincing negative", found["negative"])):
        lines += [f"- {part}: {name}: {word[check]}" for name, check in checks.items()]
    if found["failing"]["retention"]:
        lines.append("- P(full) under the comparator's by more than the margin: " + ", ".join(found["failing"]["retention"]))
    if found["failing"]["falls"]:
        lines.append("- divergence fell less: " + ", ".join(found["failing"]["falls"]))
    if found["v_cannot_win"]:
        lines.append("V cannot win by the rule, whatever the arms still to come show.")
    if found["negative_out_of_reach"]:
        lines.append("The convincing negative is out of reach.")
    return lines


# ---------------------------------------------------------------------------- records

def weights_sha256(model: Path) -> str:
    """The sha256 of a model folder's weights: which S records were measured from."""
    digest = hashlib.sha256()
    with open(model / "model.safetensors", "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def evaluation_folders(out: Path) -> list[Path]:
    """Every evaluation folder of the gate and the arms, finished or not."""
    gate = [out / folder for folder in dict.fromkeys(f for pair in GATE_LOGS.values() for f in pair)]
    arms = [f for kind in ("eval", "eval-seen", "eval-btest") for f in sorted((out / "arms" / kind).glob("*")) if f.is_dir()]
    return [f for f in gate + arms if (f / "config.yaml").exists()]


def trained_runs(out: Path) -> list[Path]:
    """Every arm's training run that finished (its weights hash written by the scripts' `train`) and
    whose evaluations did too: restored, such a run is not trained again, so one whose weights are
    gone before its evaluations finished must train again. The gradient-norm run is never evaluated
    (its figures are its metrics)."""
    arms = out / "arms"
    return sorted(run.parent for run in arms.glob("*/weights.sha256")
                  if run.parent.name.endswith("-norms")
                  or all(finished_log(arms / kind / run.parent.name) is not None for kind in ("eval", "eval-seen")))


def kept_times(out: Path, runs: list[Path]) -> str:
    """times.tsv's lines of what a restore does not run again: the kept runs and the calibrations
    (whose figure is their time); the labelling runs again after a loss (its files are S's to
    remake), and a line kept for it would count its CPU seconds twice."""
    names = {run.name for run in runs}
    lines = (out / "arms" / "times.tsv").read_text().splitlines(keepends=True)
    return "".join(line for line in lines if line.split()[0] in names or line.startswith("cal-"))


def kept_files(out: Path, runs: list[Path]) -> dict[str, Path]:
    """Relative path -> file, of what the figures are read from: each finished evaluation's config,
    fingerprint and conversations, the gate's verdict, the frozen rule, the metrics and weights hash
    of `runs` (`trained_runs`; `keep` adds the CPU seconds). Checkpoints and the corpora S remakes
    are left out."""
    files = {}
    for folder in evaluation_folders(out):
        if finished_log(folder) is not None:
            files.update({str((folder / name).relative_to(out)): folder / name  # the fingerprint: fic eval resumes
                          for name in ("config.yaml", "fingerprint.json", "conversations.jsonl") if (folder / name).exists()})
    for run in runs:
        files.update({str((run / name).relative_to(out)): run / name
                      for name in ("weights.sha256", "metrics.jsonl") if (run / name).exists()})
    for name in ("gate.json", "arms/rule.json"):
        if (out / name).exists():
            files[name] = out / name
    return files


def keep(out: Path, s: Path, records: Path = RECORDS) -> list[str]:
    """Copy what the figures are read from into `records` (logs gzipped, byte-stable), stamped with
    S's weights hash; records of another S are refused. Returns the paths written or changed."""
    stamp = {"s_sha256": weights_sha256(s), "out": str(out)}
    found = records / "s.json"
    if found.exists() and json.loads(found.read_text()) != stamp:
        raise FicError(f"these records are of another S or OUT ({json.loads(found.read_text())}, not {stamp}): "
                       "move them aside before keeping a new start's", path=str(found))
    write_json(found, stamp)
    written = []
    runs = trained_runs(out)  # reads every arm's logs whole: once
    contents = {name: source.read_bytes() for name, source in kept_files(out, runs).items()}
    if (out / "arms" / "times.tsv").exists():
        contents["arms/times.tsv"] = kept_times(out, runs).encode()
    for name, data in contents.items():
        if name.endswith((".jsonl", "fingerprint.json")):  # the bulk: 2.2 MB of B-dev log gzips to 0.12
            name, data = name + ".gz", gzip.compress(data, mtime=0)
        target = records / name
        if not target.exists() or target.read_bytes() != data:
            target.parent.mkdir(parents=True, exist_ok=True)
            with atomic_open(target, "wb", encoding=None) as handle:
                handle.write(data)
            written.append(name)
    return written


def restore(out: Path, s: Path, records: Path = RECORDS) -> list[str]:
    """Copy `records` back into OUT, for a rebuilt S whose weights are the ones they were measured
    from (else an error: they cannot be paired with it). A finished step found there is passed over
    by the scripts: an evaluation whose log is whole, a run whose weights hash is written."""
    found = records / "s.json"
    if not found.exists():
        raise FicError("no records here", path=str(records))
    stamp = json.loads(found.read_text())
    if stamp["s_sha256"] != weights_sha256(s):
        raise FicError(f"the records were measured from S {stamp['s_sha256'][:16]}, this S is "
                       f"{weights_sha256(s)[:16]}: not the same model, so nothing of them can be paired with it",
                       path=str(s))
    if stamp["out"] != str(out):
        raise FicError(f"the records' configs name the folder {stamp['out']}: restore into it", path=str(out))
    restored = []
    for source in sorted(p for p in records.rglob("*") if p.is_file() and p != found):
        name = str(source.relative_to(records)).removesuffix(".gz")
        data = gzip.decompress(source.read_bytes()) if source.suffix == ".gz" else source.read_bytes()
        target = out / name
        if target.exists() and len(target.read_bytes()) >= len(data):  # as far or further on here
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        with atomic_open(target, "wb", encoding=None) as handle:
            handle.write(data)
        restored.append(name)
    return restored


# ---------------------------------------------------------------------------- the decision

def choose_rate(out: Path, name: str, seed: int, lrs: list[str]) -> str:
    """The rate of `lrs` whose `name` arm at `seed` has the best sharded P on B-dev (a tie: the first
    listed). Every rate's evaluation must have finished: a choice among some of them is not made."""
    scores = {}
    for lr in lrs:
        folder = out / "arms" / "eval" / f"{name}-lr{lr}-s{seed}"
        log = finished_log(folder)
        if log is None:
            raise FicError(f"{name} at rate {lr}, seed {seed}: its B-dev evaluation has not finished, so no rate "
                           "is chosen yet", path=str(folder))
        scores[lr] = view_p(log, "sharded", origin=str(folder))
    return max(lrs, key=scores.__getitem__)


def kept_full(v: float, other: float, rule: dict = RULE) -> bool:
    """The rule's retention clause: V's P(full) at most `full_margin` points under the other model's."""
    return v >= other - rule["full_margin"]


def every_seed(values: list, holds) -> bool | None:
    """A check over seeds while some are unmeasured (None): False once a measured one fails (no later
    seed can mend it), True when every one is measured and holds, else None (still open)."""
    if any(v is not None and not holds(v) for v in values):
        return False
    return True if all(v is not None for v in values) else None


def settled(report: dict, seeds: list[int], rule: dict = RULE) -> dict:
    """The rule's checks that the figures measured so far decide already: V beats S and C2 (at its
    chosen rate) in every seed, V's P(full) within the margin of theirs, V's held-out divergence
    fall. Each is True, False or None (a figure still missing). One False win check means V cannot
    win whatever the arms to come show; one False negative check, that the convincing negative is
    out of reach."""
    models, pairs = report["models"], report["pairs"]
    win, retention = {}, {}
    for other in ("S", "C2"):
        gaps = [None if (g := pairs.get(f"V s{seed} - {comparator(other, seed)}")) is None else g["difference"]
                for seed in seeds]
        win[f"V beats {other} in every seed"] = every_seed(gaps, lambda d: d > 0)
        for seed in seeds:
            mine, theirs = models.get(f"V s{seed}"), models.get(comparator(other, seed))
            for key in ("full", "seen_full"):
                retention[(seed, key, other)] = (None if mine is None or theirs is None or mine[key] is None
                                                 or theirs[key] is None else (mine[key], theirs[key]))
    win[f"P(full) within {rule['full_margin']:g} of S and C2 on both sets"] = every_seed(
        list(retention.values()), lambda pair: kept_full(*pair, rule))
    falls = {seed: (report["v_held_out_divergence"].get(seed) or {}).get("fall") for seed in seeds}
    negative = {f"V's held-out divergence fell >= {DIVERGENCE_FALL:.0%} in every seed":
                    every_seed(list(falls.values()), lambda f: f >= DIVERGENCE_FALL)}
    failing = {"retention": [f"V s{seed} {'seen dev' if key == 'seen_full' else 'B-dev'} {pair[0]:.1f} vs {other} "
                             f"{pair[1]:.1f}" for (seed, key, other), pair in retention.items()
                             if pair and not kept_full(*pair, rule)],
               "falls": [f"V s{seed} {100 * f:.0f}%" for seed, f in falls.items() if f is not None and f < DIVERGENCE_FALL]}
    return {"win": win, "negative": negative, "failing": failing,
            "v_cannot_win": any(check is False for check in win.values()),
            "negative_out_of_reach": any(check is False for check in negative.values())}


def decide(rows: dict, rule: dict = RULE) -> dict:
    """The rule applied to per-seed paired figures. `rows[seed]` holds `v_c2` and `v_s`
    (`view_gap` of sharded scores on B-dev) and `full` ({"V", "C2", "S"}: P(full) on
    B-dev) and `full_seen` (the same on the seen-function dev set)."""
    seeds = sorted(rows)
    v_c2 = [rows[s]["v_c2"]["difference"] for s in seeds]
    checks = {
        "V beats C2 in every seed": all(d > 0 for d in v_c2),
        f"mean V - C2 >= {rule['min_win']}": sum(v_c2) / len(v_c2) >= rule["min_win"],
        # a seed counts when V is the better one there: a significant loss is no evidence of a win
        f"p < {rule['max_p']} in >= {rule['p_seeds']} seeds": sum(
            rows[s]["v_c2"]["difference"] > 0 and rows[s]["v_c2"]["p_value"] < rule["max_p"]
            for s in seeds) >= rule["p_seeds"],
        "V beats S in every seed": all(rows[s]["v_s"]["difference"] > 0 for s in seeds),
        f"P(full) within {rule['full_margin']} of C2 and S on both sets": all(
            kept_full(rows[s][key]["V"], rows[s][key][other], rule)
            for s in seeds for key in ("full", "full_seen") for other in ("C2", "S")),
    }
    seed_level = mean_interval(v_c2) if len(v_c2) >= 2 else None
    return {"seeds": seeds, "v_minus_c2_by_seed": v_c2, "seed_level": seed_level, "checks": checks,
            "v_wins_on_dev": all(checks.values()), "rule_hash": rule_hash(rule)}


def negative(gate_passed: bool, h_s: float | None, falls: list[float | None], seed_level: dict | None,
             rule: dict = RULE) -> dict:
    """The rule's convincing negative: the gate passed, H - S (points, sharded P on B-dev) reaches
    `h_min`, V's held-out divergence fell by DIVERGENCE_FALL in every seed, and the seed-level upper
    bound of V - C2 is under NEGATIVE_BOUND. A figure not measured yet fails its check."""
    checks = {"the gate passed": gate_passed,
              f"H - S >= {rule['h_min']:g}": h_s is not None and h_s >= rule["h_min"],
              f"V's held-out divergence fell >= {DIVERGENCE_FALL:.0%} in every seed":
                  bool(falls) and all(f is not None and f >= DIVERGENCE_FALL for f in falls),
              f"seed-level upper bound of V - C2 < {NEGATIVE_BOUND:g}":
                  seed_level is not None and seed_level["high"] < NEGATIVE_BOUND}
    return {"checks": checks, "convincing": all(checks.values())}


def arm_rows(out: Path, seeds: list[int], lr: dict[str, str]) -> dict:
    """Per-seed paired figures from the arms' evaluation logs (chosen rates `lr` for C1, C2): the
    rule's V - C2, V - S, P(full); V - C1 where C1 ran that seed, for the record."""
    def logs(name: str) -> tuple[list[dict], list[dict]]:
        found = []
        for folder in (out / "arms" / "eval" / name, out / "arms" / "eval-seen" / name):
            log = finished_log(folder)
            if log is None:
                raise FicError(f"{name}: this evaluation has not finished", path=str(folder))
            found.append(log)
        return found[0], found[1]

    def paired(a: list[dict], b: list[dict]) -> dict:
        return view_gap(a, b, teacher_view="sharded", origin=str(out / "arms" / "eval"))

    def full_p(*named: tuple[str, list[dict]]) -> dict[str, float]:
        return {name: view_p(log, "full") for name, log in named}

    s_log, s_seen = logs("s")
    rows = {}
    for seed in seeds:
        v, v_seen = logs(f"v-s{seed}")
        c2, c2_seen = logs(f"c2-lr{lr['c2']}-s{seed}")
        rows[seed] = {"v_c2": paired(v, c2), "v_s": paired(v, s_log),
                      "full": full_p(("V", v), ("C2", c2), ("S", s_log)),
                      "full_seen": full_p(("V", v_seen), ("C2", c2_seen), ("S", s_seen))}
        c1 = finished_log(out / "arms" / "eval" / f"c1-lr{lr['c1']}-s{seed}") if lr.get("c1") else None
        if c1 is not None:
            rows[seed]["v_c1"] = paired(v, c1)
    return rows


def verdict(out: Path, seeds: list[int], lrs: list[str]) -> dict:
    """The rule on the arms' B-dev evaluations, C2's (and C1's, when its runs finished) rate chosen
    on B-dev at the first seed, and the convincing negative's checks beside it."""
    rates = {"c2": choose_rate(out, "c2", seeds[0], lrs)}
    try:
        rates["c1"] = choose_rate(out, "c1", seeds[0], lrs)
    except FicError:  # C1 is reported when it finished; the rule does not read it
        pass
    result = decide(arm_rows(out, seeds, rates))
    gate_file = out / "gate.json"
    gate_passed = gate_file.exists() and bool((json.loads(gate_file.read_text()).get("verdict") or {}).get("passed"))
    h, s = (finished_log(out / "arms" / "eval" / name) for name in ("h-s0", "s"))
    h_s = view_gap(h, s, teacher_view="sharded", origin=str(out / "arms" / "eval"))["difference"] if h and s else None
    falls = [held_out(out / "arms" / f"v-s{seed}")["fall"] if (out / "arms" / f"v-s{seed}" / "metrics.jsonl").exists()
             else None for seed in seeds]
    return {**result, "rates": rates, "h_minus_s": h_s, "v_held_out_fall_by_seed": falls,
            "negative": negative(gate_passed, h_s, falls, result["seed_level"])}


def btest_read(out: Path, seeds: list[int], lrs: list[str]) -> dict:
    """The rule's last clause, read once after `decide` on B-test (which chose nothing): each V seed
    against C2 at its chosen rate in the same seed and against S, sharded P; the clause holds when
    the mean over seeds of V - C2 is above 0. Every evaluation must have finished."""
    rate = choose_rate(out, "c2", seeds[0], lrs)
    names = {"S": "s", **{f"{arm} s{seed}": f"{folder}-s{seed}" for seed in seeds
                          for arm, folder in (("V", "v"), ("C2", f"c2-lr{rate}"))}}
    pairs = [(f"V s{seed}", other) for seed in seeds for other in (f"C2 s{seed}", "S")]
    found = compare(out, names, pairs, kind="eval-btest", seen_kind=None)
    if found["not_finished"]:
        raise FicError("the B-test read waits for every evaluation: not finished: " + ", ".join(found["not_finished"]),
                       path=str(out / "arms" / "eval-btest"))
    v_c2 = [found["pairs"][f"V s{seed} - C2 s{seed}"]["difference"] for seed in seeds]
    mean, levels = sum(v_c2) / len(v_c2), seed_level(found["pairs"], seeds)
    return {"c2_rate": rate, **found, "v_minus_c2_by_seed": v_c2, "v_minus_c2_mean": mean,
            "seed_level": levels.get("V - C2"), "v_minus_s_seed_level": levels.get("V - S"),
            "clause": "V - C2 > 0 (mean over seeds)", "holds": mean > 0, "rule_hash": rule_hash()}


def btest_markdown(read: dict) -> str:
    level = read["seed_level"]
    interval = "" if level is None else f" (t interval {level['low']:+.1f} to {level['high']:+.1f})"
    return "\n".join([f"B-test, read once; C2 at its chosen rate {read['c2_rate']}.", "",
                      *comparison_markdown(read, where="B-test", seen=False), "",
                      f"mean over seeds of V - C2: {read['v_minus_c2_mean']:+.1f}{interval}; "
                      f"the rule's last clause ({read['clause']}): {'holds' if read['holds'] else 'fails'}",
                      *([] if read["v_minus_s_seed_level"] is None else [level_line("V - S", read["v_minus_s_seed_level"])])])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("gate")
    p.add_argument("--out", type=Path, required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--run", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--v-steps", type=int, default=32)
    p.add_argument("--lrs", nargs="+", default=RATES)
    p.add_argument("--pilot-lr", default="1.0e-4", help="C2's rate in the pilot")
    p.add_argument("--records", type=Path, default=RECORDS, help="where the scripts keep each finished step")
    p = sub.add_parser("mix")
    p.add_argument("--self", dest="own", type=Path, required=True)
    p.add_argument("--seen", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p = sub.add_parser("steps")
    p.add_argument("--budget-s", type=float, required=True)
    p.add_argument("--calibration", type=float, nargs=2, required=True, metavar=("SHORT_S", "LONG_S"),
                   help=f"CPU seconds of the arm's config run for {CALIBRATION_STEPS[0]} and {CALIBRATION_STEPS[1]} steps")
    p.add_argument("--less-held-out", type=Path, metavar="VASD_RUN",
                   help="leave out the CPU seconds this VASD run spent on its held-out figures (held_out_cpu_s)")
    p = sub.add_parser("pilot")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr-c2", default="1.0e-4", help="C2's rate in the pilot")
    p = sub.add_parser("report")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--lrs", nargs="+", default=RATES)
    p = sub.add_parser("choose")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--arm", choices=["c1", "c2"], required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lrs", nargs="+", default=RATES)
    p = sub.add_parser("btest", help="the one B-test read, after decide (btest.sh runs its evaluations)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--lrs", nargs="+", default=RATES)
    p = sub.add_parser("decide")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--lrs", nargs="+", default=RATES, help="the controls' rates; each one's is chosen at the first seed")
    for name in ("keep", "restore"):
        p = sub.add_parser(name)
        p.add_argument("--out", type=Path, required=True)
        p.add_argument("--s", type=Path, required=True, help="S's model folder (RUN/sft/final)")
        p.add_argument("--records", type=Path, default=RECORDS)
    p = sub.add_parser("finished", help="exit 0 when an evaluation folder holds a whole log")
    p.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    if args.command in ("keep", "restore"):
        try:
            done = (keep if args.command == "keep" else restore)(args.out, args.s, args.records)
        except FicError as error:
            print(error, file=sys.stderr)
            return 2
        print(f"{args.command}: {len(done)} files" + "".join(f"\n  {name}" for name in done))
    elif args.command == "finished":
        return 0 if finished_log(args.folder) is not None else 1
    elif args.command == "gate":
        report = gate_report(args.out)
        write_json(args.out / "gate.json", report)
        print(gate_markdown(report))
    elif args.command == "prepare":
        print(prepare(args.run, args.out, args.seeds, args.v_steps, args.lrs, args.pilot_lr, args.records))
    elif args.command == "mix":
        print(f"{mix(args.own, args.seen, args.out)} conversations to {args.out}")
    elif args.command == "steps":
        try:
            measured = held_out(args.less_held_out)["cpu_s"] if args.less_held_out else 0.0
            print(calibrated_steps(args.budget_s - measured, *args.calibration))
        except (ValueError, FicError) as error:  # a calibration that measured nothing; V's log unreadable
            print(error, file=sys.stderr)
            return 2
    elif args.command == "pilot":
        report = pilot_report(args.out, args.seed, args.lr_c2)
        write_json(args.out / "arms" / "pilot.json", report)
        print(pilot_markdown(report))
    elif args.command == "report":
        report = arms_report(args.out, args.seeds, args.lrs)
        write_json(args.out / "arms" / "report.json", report)
        print(arms_markdown(report))
    elif args.command == "choose":
        try:
            print(choose_rate(args.out, args.arm, args.seed, args.lrs))
        except FicError as error:
            print(error, file=sys.stderr)
            return 2
    elif args.command == "btest":
        try:
            read = btest_read(args.out, args.seeds, args.lrs)
        except FicError as error:
            print(error, file=sys.stderr)
            return 2
        write_json(args.out / "arms" / "btest.json", read)
        print(btest_markdown(read))
    elif args.command == "decide":
        frozen = json.loads((args.out / "arms" / "rule.json").read_text())
        if frozen["hash"] != rule_hash():
            print("the rule changed since prepare froze it; refusing to decide", file=sys.stderr)
            return 2
        try:
            result = verdict(args.out, args.seeds, args.lrs)
        except FicError as error:  # an arm's evaluation not finished
            print(error, file=sys.stderr)
            return 2
        write_json(args.out / "arms" / "decision.json", result)
        print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
