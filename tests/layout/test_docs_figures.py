"""What the README and docs/ say about the code stays true: the verbs and benches they list are
the ones there are, every output the demo writes is in docs/outputs.md, and a documented fact of the
code that can be recomputed cheaply equals the recomputation. No test reads a measured count or
figure from prose: those live, dated, in docs/results.md."""

from __future__ import annotations

import re
import statistics
from pathlib import Path

import pytest

from fic.cli.bench import BENCHES
from fic.cli.main import VERBS
from fic.cli.train import METHODS

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
CLI = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
OUTPUTS = (ROOT / "docs" / "outputs.md").read_text(encoding="utf-8")


def commands() -> set[str]:
    """Every command a user can type: each verb, each `train` method and `bench` name."""
    return ((set(VERBS) - {"train", "bench"}) | {f"train {m}" for m in METHODS} | {f"bench {b}" for b in BENCHES})


def table_commands(text: str) -> set[str]:
    """The commands a verbs table's first column names (`fic bench a|b` is two)."""
    found = set()
    for cell in re.findall(r"^\| `fic ([^`]*)`", text, flags=re.MULTILINE):
        words = cell.replace("\\|", "|").split()
        verb = words[0]
        if verb in ("train", "bench") and len(words) > 1:
            found |= {f"{verb} {name}" for name in words[1].split("|")}
        else:
            found.add(verb)
    return found


@pytest.mark.parametrize("page,text", [("README.md", README), ("docs/cli.md", CLI)])
def test_the_verb_tables_list_every_command_and_no_other(page, text):
    listed = table_commands(text)
    assert listed == commands(), f"{page}: missing {sorted(commands() - listed)}, not a command {sorted(listed - commands())}"


def test_the_bench_lists_in_words_name_every_bench():
    names = ", ".join(BENCHES)
    assert f"({names})" in VERBS["bench"][1]  # `fic --help` and `fic bench --help`
    assert f"`fic bench {'|'.join(BENCHES)}`".replace("|", "\\|") in README


def expand(pattern: str) -> list[str]:
    """`a/{b,c}/d` -> `a/b/d`, `a/c/d`."""
    match = re.search(r"\{([^{}]*)\}", pattern)
    if match is None:
        return [pattern]
    return [out for option in match.group(1).split(",")
            for out in expand(pattern[:match.start()] + option + pattern[match.end():])]


def documented_demo_paths() -> set[str]:
    paths = set()
    for cell in re.findall(r"`(runs/demo/[^`]*)`", OUTPUTS):
        paths |= {p.rstrip("/") for p in expand(cell)}
    return paths


def test_every_output_of_the_demo_is_in_docs_outputs():
    from fic.demo.ablation import ablation_dir
    from fic.demo.report import PLOT
    from fic.demo.run import STAGES, DemoConfig, expand, paths, stage_outputs

    cfg = DemoConfig(out="runs/demo")
    expand(cfg, {"out": cfg.out, "base_model": cfg.base_model})
    written = {p.as_posix() for stage in STAGES for p in stage_outputs(cfg, stage)}
    written |= {p.as_posix() for p in paths(cfg).values()} | {f"runs/demo/{PLOT}", ablation_dir(cfg).as_posix()}
    documented = documented_demo_paths()
    missing = sorted(p for p in written if not any(d == p or d.startswith(p + "/") for d in documented))
    assert not missing, f"docs/outputs.md does not name what the demo writes there: {missing}"


def test_the_documented_tool_prompt_length_is_the_measured_one(smollm2_tokenizer):
    from fic.data.sources import load_source
    from fic.data.views import system_message

    text = (ROOT / "docs" / "tasks.md").read_text(encoding="utf-8")
    found = re.search(r"(\d+) test instances average\s+([\d.]+) shards, a (\d+)-token system prompt \((\d+)-(\d+),",
                      text)
    assert found, "docs/tasks.md no longer states the actions-gen test prompt's length"
    count, shards, mean, low, high = found.groups()
    instances = load_source("actions-gen:test", "actions", limit=int(count), seed=0)
    lengths = [len(smollm2_tokenizer.encode(system_message(i)["content"], add_special_tokens=False))
               for i in instances]
    assert (round(statistics.mean(lengths)), min(lengths), max(lengths)) == (int(mean), int(low), int(high))
    assert round(statistics.mean(len(i.shards) for i in instances), 1) == float(shards)


def test_no_page_tells_a_user_to_call_this_project_s_internal_tools():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    quoting = [p.name for p in pages if re.search(r"\brun\(command=|carry=\[", p.read_text(encoding="utf-8"))]
    assert not quoting, f"these pages quote a call a user cannot run: {quoting}"
