"""Every repository path the README and docs/ name (`fic/...`, `tests/...`, `launch/...`,
`tools/...`) exists: a moved or deleted file leaves no stale note behind."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# A path starts a word and is made of path characters; `<backbone>`, `*` and `{2,3}` are patterns.
PATH = re.compile(r"(?<![\w./-])((?:fic|tests|launch|tools)/[\w./{},*<>-]*[\w/>}*])")


def named_paths(page: Path) -> list[str]:
    return [m.group(1).rstrip(".") for m in PATH.finditer(page.read_text(encoding="utf-8"))]


def exists(path: str) -> bool:
    """A plain path exists; a pattern (`launch/deepspeed_zero{2,3}.yaml`, `recipes/<B>/...`,
    `launch/*.yaml`) matches at least one file."""
    if not any(c in path for c in "<{*"):
        return (ROOT / path).exists()
    expanded = re.sub(r"\{([^{}]*)\}", lambda m: "[" + "".join(m.group(1).split(",")) + "]", path)
    expanded = re.sub(r"<[^<>]*>", "*", expanded)
    return any(ROOT.glob(expanded))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_path_a_page_names_exists(page):
    missing = sorted({path for path in named_paths(page) if not exists(path)})
    assert not missing, f"{page.relative_to(ROOT)} names paths that do not exist: {missing}"


def test_the_path_reader_sees_paths_and_patterns():
    text = "see `fic/data/sources.py` and launch/deepspeed_zero{2,3}.yaml, not prefix/fic/x.py or `tests/nope.py`."
    found = PATH.findall(text)
    assert found == ["fic/data/sources.py", "launch/deepspeed_zero{2,3}.yaml", "tests/nope.py"]
    assert exists(found[0]) and exists(found[1]) and not exists(found[2])
    assert exists("tools/gpu/shapes/<B>.json") and not exists("tools/gpu/shapes/<B>.yaml")
