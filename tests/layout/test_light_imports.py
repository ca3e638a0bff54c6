"""The stages that need no model load without torch: `fic shard`, `fic views`, `fic report`, `fic sft-data`
with the pool replies and every config error answer in a fraction of a second. Engines and
trainers (torch, transformers) load only where a model is used."""

from __future__ import annotations

import subprocess
import sys

import pytest

TORCH_FREE = ["fic.cli.main", "fic.cli.data", "fic.core.config", "fic.core.files", "fic.core.generation", "fic.tasks",
              "fic.data.sources", "fic.data.views", "fic.data.splits", "fic.data.llm_sharder",
              "fic.conversation.simulator", "fic.conversation.classify", "fic.conversation.users", "fic.corpus.build",
              "fic.evaluation.evaluate", "fic.evaluation.metrics", "fic.probe.run", "fic.backends", "fic.data.hub",
              "fic.cli.report", "fic.training.curves", "fic.cli.eval", "fic.cli.probe", "fic.cli.sft_data"]


@pytest.mark.parametrize("module", TORCH_FREE)
def test_module_imports_without_torch(module):
    code = f"import sys, {module}; print('torch' in sys.modules, 'transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"], f"{module} pulls in torch or transformers at import"
