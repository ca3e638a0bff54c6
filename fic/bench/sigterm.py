"""`fic bench sigterm`: how long `fic eval` and `fic train sft` take to end after a SIGTERM, under load.

Each verb runs as its own process on a model (default: the bundled SmolLM2-135M-Instruct) while
`--busy` processes spin (default: twice the cores this process may use), and gets a SIGTERM
`--after` seconds after it made its output folder (a few moments: model loading, a generation
step or a scoring batch, a training step or a checkpoint save; where it is is not steered). Printed
for each kill: the seconds from the signal to the process's end, its exit status, whether its last
line is its own verb's, and what was left of its new output folder (a folder holding no finished
work must be gone). The headline `ratio` is the slowest end over the documented bound
(`fic.core.errors.SIGTERM_BOUND_S`): at most 1 keeps the promise.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from fic.core.errors import SIGTERM_BOUND_S, FicError

VERBS = ("eval", "train")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="models/smollm2-135m-instruct",
                        help="model folder (default: the bundled model, prepared on first use)")
    parser.add_argument("--busy", type=int, default=None,
                        help="busy-loop processes beside the verb (default: twice the cores this process may use)")
    parser.add_argument("--after", default="5,15,30",
                        help="seconds after the verb made its output folder to send SIGTERM, comma-separated "
                             "(default: 5,15,30)")
    parser.add_argument("--verbs", default="eval,train", help="which of eval, train (default: both)")


def _commands(verb: str, model: str, work: Path, out: Path) -> list[str]:
    fic = [sys.executable, "-m", "fic"]
    if verb == "eval":
        return [*fic, "eval", f"model.model={model}", "data.source=actions-gen:test", "data.task=actions",
                "data.limit=16", "views=[sharded]", "max_new_tokens=64", "temperature=1.0", f"out={out}", "--quiet"]
    return [*fic, "train", "sft", f"model.path={model}", f"data.path={work / 'corpus.jsonl'}", "train.max_steps=100",
            "train.micro_batch_size=4", "checkpoint.every=2", "logging.wandb=false", "logging.progress=false",
            f"out={out}"]


def _corpus(path: Path) -> None:
    """A small SFT corpus: arithmetic exchanges of a few hundred tokens each."""
    records = [{"messages": [{"role": "user", "content": f"What is {i} plus {i + 1}? Explain each step. " * 3},
                             {"role": "assistant", "content": f"{i} plus {i + 1} is {2 * i + 1}. " * 12}]}
               for i in range(64)]
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def terminate_when(command: list[str], ready: Callable[[], bool], *, wait_s: float = 600,
                   **popen: Any) -> tuple[float, int, list[str]]:
    """Run `command`, SIGTERM it once `ready()` (polled) is true, at the latest after `wait_s`: the
    seconds from the signal to its end, its exit status and the lines of its stderr. A command that
    ends before is an error."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(process.stderr), daemon=True)
    reader.start()
    threading.Thread(target=lambda: process.stdout.read(), daemon=True).start()
    deadline = time.monotonic() + wait_s
    while not ready() and time.monotonic() < deadline:
        if process.poll() is not None:
            raise FicError(f"{' '.join(command[:4])} ended (status {process.returncode}) before it was killed: "
                           f"{''.join(lines)[-300:]}")
        time.sleep(0.1)
    sent = time.monotonic()
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=120)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    took = time.monotonic() - sent
    reader.join(5)
    return took, process.returncode, [line.rstrip("\n") for line in lines if line.strip()]


def kill_once(command: list[str], verb: str, out: Path, after: float) -> dict:
    """Run `command`, SIGTERM it `after` seconds after it made its output folder; what it did then."""
    began: list[float] = []

    def ready() -> bool:
        if not began and out.is_dir():
            began.append(time.monotonic())
        return bool(began) and time.monotonic() - began[0] >= after

    took, status, lines = terminate_when(command, ready)
    last = lines[-1].strip() if lines else ""
    own = f"fic {'eval' if verb == 'eval' else 'train sft'}: terminated (SIGTERM)"
    finished = (out / "conversations.jsonl").is_file() or (out / "checkpoints").is_dir()
    return {"exit_s": round(took, 2), "status": status, "own_line": last.startswith(own) and
            ("resume=true" not in last or verb == "train"), "folder": "kept (finished work)" if finished else
            ("left behind" if out.exists() else "removed"), "line": last}


def measure(args: argparse.Namespace) -> dict:
    from fic.bundled.prepare import prepare_model
    from fic.core.model import BUNDLED_MODEL_DIR, check_model_folder

    model = Path(args.model)
    if model == BUNDLED_MODEL_DIR and not (model / "config.json").is_file():
        prepare_model(BUNDLED_MODEL_DIR)
    check_model_folder(model)  # before any process is started: a wrong folder is one line naming it
    try:
        afters = [float(x) for x in args.after.split(",") if x.strip()]
    except ValueError:
        raise FicError(f"expected seconds separated by commas, got {args.after!r}", field="--after") from None
    verbs = [v.strip() for v in args.verbs.split(",") if v.strip()]
    if not afters or any(v not in VERBS for v in verbs):
        raise FicError(f"expected --after seconds and --verbs from {', '.join(VERBS)}", field="--verbs")
    busy = args.busy if args.busy is not None else 2 * len(os.sched_getaffinity(0))
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    figures: dict = {"date": time.strftime("%Y-%m-%d"), "busy_processes": busy,
                     "cores": len(os.sched_getaffinity(0)), "bound_s": SIGTERM_BOUND_S}
    slowest = 0.0
    try:
        with tempfile.TemporaryDirectory(prefix="fic-bench-sigterm-") as folder:
            work = Path(folder)
            _corpus(work / "corpus.jsonl")
            for verb in verbs:
                for after in afters:
                    out = work / f"{verb}-{after:g}" / "out"
                    found = kill_once(_commands(verb, str(model), work, out), verb, out, after)
                    slowest = max(slowest, found["exit_s"])
                    for key, value in found.items():
                        figures[f"{verb}_after_{after:g}s_{key}"] = value
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    figures["slowest_exit_s"] = slowest
    figures["ratio"] = slowest / SIGTERM_BOUND_S
    return figures
