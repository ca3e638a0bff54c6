"""`fic report RUN_DIR`: (re)draw a run's figures from its files, finished or still running.

- a training run (`metrics.jsonl`: `fic train sft`, `fic train vasd`): `curves.png`;
- an evaluation (`conversations.jsonl`, `metrics.json`: `fic eval`): `report.md`,
  `scores_by_view.png`, `answer_timing.png`, `tokens_per_conversation.png`; an evaluation still
  playing (no `metrics.json` yet) is summarised from the conversations finished so far;
- a demo folder (`stages/`: `fic demo`): every training run and evaluation in it, and
  `demo_scores.png` from `stages/report.json`.

`--format lic` writes an evaluation's conversations (a demo folder's evaluations merged into one tree) in
Lost in Conversation's log format instead (`fic.evaluation.lic_logs`): `lic_logs/<task>/<conv_type>/...jsonl`,
which LiC's viewer and analyses read.

Files are only read (a line a running job is writing is passed over); figures go to RUN_DIR,
or with `--out` to another folder (a read-only run folder, a shared disk). Every file is read
through FiC's guarded readers and checked for the shape its figures need: a file that is not
UTF-8, damaged, of the wrong types or shape is one line naming it (exit 2), never a traceback.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Callable

from fic.core.config import read_yaml
from fic.core.errors import FicError
from fic.core.files import check_writable, read_growing_log, read_json
from fic.demo.report import PLOT, plot_demo
from fic.evaluation.lic_logs import LOG_FOLDER, run_settings, write_lic_logs
from fic.evaluation.metrics import record_problem, summarize
from fic.evaluation.report import write_report
from fic.training.curves import CURVES_PNG, read_metrics, write_curves


def add_arguments(parser: argparse.ArgumentParser, verb: str) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR",
                        help="a training run (out of fic train sft/vasd), an evaluation (out of fic eval) or a "
                        "demo folder (runs/demo)")
    parser.add_argument("--out", default=None, metavar="FOLDER",
                        help="write the figures here instead of into RUN_DIR (a demo keeps its layout below it)")
    parser.add_argument("--format", default="figures", choices=("figures", "lic"),
                        help="figures (default): the run's report and figures; lic: an evaluation's conversations "
                        f"as Lost in Conversation's logs, in {LOG_FOLDER}/<task>/<conv_type>/ (docs/outputs.md); a "
                        "demo folder's evaluations merged into one tree")
    parser.add_argument("--dataset-fn", default=None, metavar="NAME",
                        help="--format lic: the data file named in every record (LiC's viewer shows only records "
                        "whose dataset_fn is its task's own file). Default: LiC's file of each record's task "
                        "(e.g. sharded_instructions_600.json) when the evaluation read LiC's instances (lic: "
                        "sources), else the sources' file names")


def kind_of(folder: Path) -> str | None:
    if (folder / "stages").is_dir():
        return "demo"
    if (folder / "metrics.jsonl").is_file():
        return "training"
    if (folder / "conversations.jsonl").is_file() or (folder / "metrics.json").is_file():
        return "evaluation"
    return None


def _read_json(path: Path) -> dict:
    value = read_json(path)  # the guarded reader: bad JSON, nesting, huge numbers, devices are one line
    if not isinstance(value, dict):
        raise FicError("expected a JSON object", path=str(path))
    return value


def _conversations(path: Path) -> list[dict]:
    """The finished conversations, read only (the evaluation may be appending to the file: its
    torn last line is passed over); a record of the wrong shape is one line naming its line."""
    if not path.is_file():
        return []
    records = []
    for line, record in read_growing_log(path, "a conversations.jsonl log"):
        problem = record_problem(record)
        if problem is not None:
            raise FicError(f"line {line}: {problem}; not a conversation record of fic eval", path=str(path))
        records.append(record)
    return records


def _drawn(path: Path, what: str, draw: Callable[[], Any]) -> Any:
    """`draw()` from a JSON file FiC wrote (metrics.json, stages/report.json) whose inner shape
    is not checked key by key: a value of the wrong type or shape deep inside is one line."""
    try:
        return draw()
    except (TypeError, KeyError, ValueError, AttributeError, IndexError) as err:
        raise FicError(f"not {what}: a value has the wrong type or shape ({type(err).__name__}: {str(err)[:120]})",
                       path=str(path)) from None


def report_training(folder: Path, out: Path) -> list[Path]:
    path = write_curves(folder, out / CURVES_PNG)
    if path is None:
        raise FicError("no step logged yet in metrics.jsonl; nothing to draw", path=str(folder / "metrics.jsonl"))
    return [path]


def report_evaluation(folder: Path, out: Path) -> list[Path]:
    records = _conversations(folder / "conversations.jsonl")
    if (folder / "metrics.json").is_file():
        metrics = _read_json(folder / "metrics.json")
        if not isinstance(metrics.get("tasks"), dict) or not isinstance(metrics.get("views"), dict):
            raise FicError("not the metrics.json of a fic eval run (no tasks/views)", path=str(folder / "metrics.json"))
    elif records:
        metrics = summarize(records)  # still playing: the conversations finished so far, no baseline
        metrics["settings"] = {}
    else:
        raise FicError("no finished conversation yet; nothing to draw", path=str(folder / "conversations.jsonl"))
    where = folder / "metrics.json" if (folder / "metrics.json").is_file() else folder / "conversations.jsonl"
    report = _drawn(where, "the run files of a fic eval run", lambda: write_report(out, metrics, records))
    return [report, *(out / name for name in ("scores_by_view.png", "answer_timing.png", "tokens_per_conversation.png"))]


def export_lic(folder: Path, out: Path, dataset_fn: str | None = None) -> list[Path]:
    """An evaluation's conversations (every evaluation's of a demo folder, merged) as one tree of
    LiC's logs, `out/lic_logs/`."""
    runs = [folder] if kind_of(folder) == "evaluation" else \
        sorted(p for p in folder.rglob("*") if p.is_dir() and kind_of(p) == "evaluation")
    found = []
    for run in runs:
        records = _conversations(run / "conversations.jsonl")
        if not records:
            continue
        config = read_yaml(run / "config.yaml") if (run / "config.yaml").is_file() else {}
        metrics = _read_json(run / "metrics.json") if (run / "metrics.json").is_file() else None
        settings = run_settings(config, metrics, dataset_fn)
        if not settings["model"] and not all(r.get("model") for r in records):
            raise FicError("cannot tell which model played these conversations (no config.yaml, no model in the "
                           "records)", path=str(run))
        found.append((records, settings))
    if not found:
        raise FicError("no finished conversation to export (no evaluation with conversations.jsonl)", path=str(folder))
    where = folder / "conversations.jsonl" if len(runs) == 1 else folder
    return _drawn(where, "the conversations of a fic eval run", lambda: write_lic_logs(found, out / LOG_FOLDER))


def report_demo(folder: Path, out: Path) -> list[Path]:
    written = []
    for sub in sorted(p for p in folder.rglob("*") if p.is_dir()):
        kind = kind_of(sub)
        target = out / sub.relative_to(folder)
        if kind == "training" and read_metrics(sub / "metrics.jsonl"):
            written += report_training(sub, target)
        elif kind == "evaluation" and ((sub / "metrics.json").is_file() or _conversations(sub / "conversations.jsonl")):
            written += report_evaluation(sub, target)
    marker = folder / "stages" / "report.json"
    if marker.is_file():
        figures = _read_json(marker).get("figures") or {"sets": {}}
        path = _drawn(marker, "the report.json of a fic demo", lambda: plot_demo(figures, out / PLOT))
        written += [path] if path is not None else []
    if not written:
        raise FicError("no finished stage to draw yet (no training metrics, evaluation or report)", path=str(folder))
    return written


def run(args: argparse.Namespace) -> int:
    folder = Path(args.run_dir)
    out = Path(args.out) if args.out else folder
    if args.out:  # before anything is read
        check_writable(out, folder=True, field="--out")
    if not folder.exists():
        raise FicError("no such run folder", path=str(folder), field="RUN_DIR")
    if not folder.is_dir():
        raise FicError("is a file, expected a run folder (the out folder of fic train, fic eval or fic demo)",
                       path=str(folder), field="RUN_DIR")
    kind = kind_of(folder)
    if kind is None:
        raise FicError("not a run folder: expected metrics.jsonl (a training run), conversations.jsonl or "
                       "metrics.json (an evaluation), or stages/ (a demo)", path=str(folder), field="RUN_DIR")
    if not args.out:
        check_writable(out, folder=True, field="RUN_DIR")
    if args.format == "lic":
        if kind == "training":
            raise FicError("--format lic exports an evaluation's conversations; this is a training run", path=str(folder),
                           field="RUN_DIR")
        written = export_lic(folder, out, args.dataset_fn)
    elif args.dataset_fn is not None:
        raise FicError("--dataset-fn names the data file in LiC's logs: it goes with --format lic", field="--dataset-fn")
    else:
        written = {"training": report_training, "evaluation": report_evaluation, "demo": report_demo}[kind](folder, out)
    for path in written:
        print(f"wrote {path}")
    return 0
