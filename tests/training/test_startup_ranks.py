"""Start-up of a multi-process run on a CPU: FiC makes Accelerate see the real ranks (every rank used to
report process 0 of 1 under DeepSpeed, and each took the out folder's lock: the second died), under
DeepSpeed, DDP (`ACCELERATE_USE_CPU=true`, what `--cpu` asks for, under torchrun) and FSDP2."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest
from ranks import free_port

pytestmark = pytest.mark.slow  # 2 processes a launch

REPO = Path(__file__).resolve().parents[2]
PROBE = """
import sys
from fic.training import loop
from fic.training.sft import SFTConfig
accelerator = loop.make_accelerator(SFTConfig(out=sys.argv[1]))
# A file per rank, not stdout: unbuffered ranks share one pipe and their prints interleave word by word.
with open(f"{sys.argv[2]}/rank{accelerator.process_index}", "w") as seen:
    seen.write(f"{accelerator.process_index} {accelerator.num_processes} {accelerator.distributed_type.value}")
"""


def ranks_seen(tmp_path: Path, launcher: list[str], env: dict | None = None) -> list[tuple]:
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    seen = tmp_path / "seen"
    seen.mkdir()
    proc = subprocess.run([sys.executable, "-m", *launcher, str(probe), str(tmp_path / "out"), str(seen)], cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **(env or {})},
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return sorted(tuple(path.read_text().split()) for path in seen.iterdir())


@pytest.mark.skipif(find_spec("deepspeed") is None, reason="deepspeed does not import (pip install -e .[deepspeed])")
def test_two_ranks_under_deepspeed_on_a_cpu(tmp_path):
    launch = ["accelerate.commands.launch", "--config_file", "launch/deepspeed_zero3.yaml", "--num_processes", "2",
              "--main_process_port", str(free_port())]
    assert ranks_seen(tmp_path, launch) == [("0", "2", "DEEPSPEED"), ("1", "2", "DEEPSPEED")]


def test_two_ranks_of_ddp_under_torchrun_with_accelerate_use_cpu(tmp_path):
    launch = ["torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    assert ranks_seen(tmp_path, launch, {"ACCELERATE_USE_CPU": "true"}) == [("0", "2", "MULTI_CPU"),
                                                                            ("1", "2", "MULTI_CPU")]


def test_two_ranks_under_fsdp2_on_a_cpu(tmp_path):
    launch = ["accelerate.commands.launch", "--config_file", "launch/fsdp2.yaml", "--num_processes", "2",
              "--main_process_port", str(free_port())]
    assert ranks_seen(tmp_path, launch) == [("0", "2", "FSDP"), ("1", "2", "FSDP")]
