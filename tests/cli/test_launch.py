"""The launch files: `fic launch-check` refuses a wrong set-up in one line, and the torchrun and SLURM
scripts print (DRY_RUN=1) or start exactly the command each node runs."""

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from fic.cli.main import main

REPO = Path(__file__).resolve().parents[2]
RECIPE = "recipes/llama-3.1-8b-instruct/sft.yaml"      # 4 x 2 per GPU: 64 conversations on 8 GPUs
SCRIPT = "fic/train_sft.py"
LAUNCH_CONFIGS = sorted(str(p.relative_to(REPO)) for p in (REPO / "launch").glob("*.yaml"))


def check(*args: str) -> list[str]:
    return ["launch-check", *args]


def write_config(tmp_path: Path, name: str = "launch.yaml", **changes) -> str:
    """launch/deepspeed_zero2.yaml with some keys changed (None removes one); nested as a.b."""
    config = yaml.safe_load((REPO / "launch/deepspeed_zero2.yaml").read_text())
    for key, value in changes.items():
        node, *path = key.split("__")
        target = config if not path else config.setdefault(node, {})
        field = path[0] if path else node
        if value is None:
            target.pop(field, None)
        else:
            target[field] = value
    out = tmp_path / name
    out.write_text(yaml.safe_dump(config))
    return str(out)


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


# --------------------------------------------------------------------------- the checker

@pytest.mark.parametrize("config", LAUNCH_CONFIGS)
def test_every_launch_config_passes_with_a_recipe(config, capsys):
    assert main(check("--config_file", config, "--recipe", RECIPE, "--script", SCRIPT)) == 0
    assert "ok:" in capsys.readouterr().err


def test_missing_launch_file(capsys):
    assert main(check("--config_file", "launch/nope.yaml", "--recipe", RECIPE)) == 2
    assert one_error_line(capsys) == "fic launch-check: error: launch/nope.yaml: launch config not found"


def test_missing_recipe_and_script(capsys):
    assert main(check("--config_file", "launch/deepspeed_zero2.yaml", "--recipe", "recipes/x/sft.yaml")) == 2
    assert "recipes/x/sft.yaml: recipe not found" in one_error_line(capsys)
    assert main(check("--config_file", "launch/deepspeed_zero2.yaml", "--recipe", RECIPE,
                      "--script", "fic/train_nothing.py")) == 2
    assert "fic/train_nothing.py: training script not found" in one_error_line(capsys)


def test_zero_stage_4(tmp_path, capsys):
    bad = write_config(tmp_path, deepspeed_config__zero_stage=4)
    assert main(check("--config_file", bad, "--recipe", RECIPE)) == 2
    assert one_error_line(capsys).endswith(f"{bad}: field 'deepspeed_config.zero_stage': "
                                           "expected ZeRO stage 2 or 3, got 4")


def test_zero_stage_read_from_a_deepspeed_json(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # accelerate reads deepspeed_config_file relative to the working directory
    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 1}, "gradient_accumulation_steps": "auto"}')
    bad = write_config(tmp_path, deepspeed_config__deepspeed_config_file="ds.json", deepspeed_config__zero_stage=None)
    assert main(check("--config_file", bad, "--recipe", str(REPO / RECIPE))) == 2
    assert "ds.json: field 'zero_optimization.stage': expected ZeRO stage 2 or 3, got 1" in one_error_line(capsys)


def test_unknown_distributed_type(tmp_path, capsys):
    bad = write_config(tmp_path, distributed_type="MEGATRON_LM")
    assert main(check("--config_file", bad, "--recipe", RECIPE)) == 2
    assert "field 'distributed_type': expected one of NO, MULTI_GPU, DEEPSPEED, FSDP" in one_error_line(capsys)


def test_fsdp2_passes_and_fsdp1_or_an_unsaved_state_dict_is_refused(tmp_path, capsys):
    assert main(check("--config_file", "launch/fsdp2.yaml", "--recipe", RECIPE, "--num_processes", "2")) == 0
    assert "FSDP version 2, 2 processes on 1 machine" in capsys.readouterr().err
    config = yaml.safe_load((REPO / "launch/fsdp2.yaml").read_text())
    for key, value, expected in (("fsdp_version", 1, "expected FSDP version 2"),
                                 ("fsdp_state_dict_type", "LOCAL_STATE_DICT", "expected one of SHARDED_STATE_DICT")):
        bad = tmp_path / f"{key}.yaml"
        bad.write_text(yaml.safe_dump({**config, "fsdp_config": {**config["fsdp_config"], key: value}}))
        assert main(check("--config_file", str(bad), "--recipe", RECIPE)) == 2
        assert f"field 'fsdp_config.{key}': {expected}" in one_error_line(capsys)


def test_a_deep_launch_config_or_override_is_one_line(tmp_path, capsys):
    deep = tmp_path / "deep.yaml"
    deep.write_text("distributed_type: NO\nextra: " + "[" * 5000 + "]" * 5000 + "\n")
    assert main(check("--config_file", str(deep), "--recipe", RECIPE)) == 2
    assert "nested more than 64 levels deep" in one_error_line(capsys)
    assert main(check("--config_file", "launch/deepspeed_zero2.yaml", "--recipe", RECIPE,
                      "train.micro_batch_size=" + "[" * 5000 + "]" * 5000)) == 2
    assert "field 'train.micro_batch_size'" in one_error_line(capsys)
    assert main(check("--config_file", "launch/deepspeed_zero2.yaml", "--recipe", RECIPE, "train.micro_batch_size=[")) == 2
    assert "expected a positive integer, got '['" in one_error_line(capsys)  # a traceback before


@pytest.mark.parametrize("key", ["gradient_accumulation_steps", "deepspeed_config__gradient_accumulation_steps"])
def test_gradient_accumulation_in_the_launch_file(key, tmp_path, capsys):
    bad = write_config(tmp_path, **{key: 4})
    assert main(check("--config_file", bad, "--recipe", RECIPE)) == 2
    line = one_error_line(capsys)
    assert f"field '{key.replace('__', '.')}': remove it: the recipe's train.grad_accum_steps" in line


def test_gradient_accumulation_in_a_deepspeed_json(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 2}, "gradient_accumulation_steps": 8}')
    bad = write_config(tmp_path, deepspeed_config__deepspeed_config_file="ds.json")
    assert main(check("--config_file", bad, "--recipe", str(REPO / RECIPE))) == 2
    assert "ds.json: field 'gradient_accumulation_steps'" in one_error_line(capsys)


def test_gpu_count_that_does_not_divide_the_global_batch(capsys):
    # 64 conversations over 12 GPUs x micro-batch 4 = 48 per accumulation step: no whole number of steps.
    assert main(check("--config_file", "launch/accelerate_multi_node.yaml", "--recipe", RECIPE,
                      "--num_machines", "2", "--num_processes", "16", "--gpus_per_node", "6",
                      "--global_batch", "64")) == 2
    assert one_error_line(capsys) == (
        "fic launch-check: error: launch/accelerate_multi_node.yaml: field 'num_processes': expected num_machines "
        "x 6 GPUs = 12 processes (one per GPU on every node), got 16 (from --num_processes)")
    assert main(check("--config_file", "launch/accelerate_multi_node.yaml", "--recipe", RECIPE,
                      "--num_machines", "2", "--num_processes", "12", "--gpus_per_node", "6",
                      "--global_batch", "64")) == 2
    assert one_error_line(capsys).endswith(
        "command line: field '--global_batch': a global batch of 64 conversations is not divisible by 12 processes "
        "x train.micro_batch_size 4 = 48; use a GPU count or micro-batch whose product divides it")


def test_global_batch_prints_the_accumulation_that_keeps_it(capsys):
    assert main(check("--config_file", "launch/accelerate_multi_node.yaml", "--recipe", RECIPE,
                      "--num_machines", "2", "--num_processes", "16", "--global_batch", "64")) == 0
    out = capsys.readouterr()
    assert out.out == "train.grad_accum_steps=1\n"
    assert "16 processes on 2 machines x micro-batch 4 x accumulation 1 = 64 conversations" in out.err
    # A micro-batch given as an override is the one divided.
    assert main(check("--config_file", "launch/deepspeed_zero2.yaml", "--recipe", RECIPE, "--global_batch", "64",
                      "train.micro_batch_size=2")) == 0
    assert capsys.readouterr().out == "train.grad_accum_steps=4\n"


def test_deepspeed_json_train_batch_size_must_match_the_recipe(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 2}, "train_batch_size": 128}')
    config = write_config(tmp_path, deepspeed_config__deepspeed_config_file="ds.json")
    assert main(check("--config_file", config, "--recipe", str(REPO / RECIPE))) == 2
    assert "ds.json: field 'train_batch_size': 128 conversations per step, but the launch makes 64; set it to " \
           '"auto" (the recipe decides) or train.grad_accum_steps to 4' in one_error_line(capsys)
    assert main(check("--config_file", config, "--recipe", str(REPO / RECIPE), "train.grad_accum_steps=4")) == 0


def test_process_counts(capsys):
    assert main(check("--config_file", "launch/accelerate_single.yaml", "--recipe", RECIPE, "--num_processes", "2")) == 2
    assert "distributed_type NO runs one process, got 2" in one_error_line(capsys)
    assert main(check("--config_file", "launch/deepspeed_zero2.yaml", "--recipe", RECIPE, "--num_processes", "9")) == 2
    assert "expected at most 8 processes on one machine" in one_error_line(capsys)


def test_multi_node_deepspeed_needs_the_standard_launcher(tmp_path, capsys):
    bad = write_config(tmp_path, deepspeed_config__deepspeed_multinode_launcher=None)
    assert main(check("--config_file", bad, "--recipe", RECIPE, "--num_machines", "2", "--num_processes", "16")) == 2
    assert "field 'deepspeed_config.deepspeed_multinode_launcher': expected 'standard' on 2 machines" \
        in one_error_line(capsys)


def test_the_checker_exits_2_in_one_line_without_importing_torch():
    code = ("import sys\nfrom fic.cli.main import main\n"
            "rc = main(['launch-check', '--config_file', 'launch/deepspeed_zero3.yaml', '--recipe', sys.argv[1]])\n"
            "assert 'torch' not in sys.modules and 'accelerate' not in sys.modules, 'heavy import'\n"
            "rc2 = main(['launch-check', '--config_file', 'launch/nope.yaml', '--recipe', sys.argv[1]])\n"
            "sys.exit(10 * rc + rc2)")
    done = subprocess.run([sys.executable, "-c", code, RECIPE], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines()[-1] == "fic launch-check: error: launch/nope.yaml: launch config not found"


# --------------------------------------------------------------------------- the scripts

def script_env(env: dict | None = None, path_prefix: Path | None = None, dry_run: bool = True) -> dict:
    """This environment without anything the scripts read, plus `env`; stand-ins first on PATH."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "NNODES", "NODE_RANK", "MASTER_",
                                                                     "GLOBAL_BATCH", "LAUNCH_CONFIG", "DRY_RUN"))}
    base["PYTHON"] = sys.executable
    if path_prefix is not None:
        base["PATH"] = f"{path_prefix}{os.pathsep}{base['PATH']}"
    if dry_run:
        base["DRY_RUN"] = "1"
    return {**base, **(env or {})}


def run_script(script: str, *args: str, env: dict | None = None, path_prefix: Path | None = None,
               dry_run: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", script, *args], cwd=REPO, env=script_env(env, path_prefix, dry_run),
                          capture_output=True, text=True, timeout=60)


def slurm_env(nodes: int, job: int = 4242, **extra) -> dict:
    hosts = ",".join(f"gpu{i:03d}" for i in range(1, nodes + 1))
    return {"SLURM_SUBMIT_DIR": str(REPO), "SLURM_JOB_ID": str(job), "SLURM_JOB_NUM_NODES": str(nodes),
            "SLURM_JOB_NODELIST": hosts, **extra}


def node_line(rank: int, nodes: int, config: str, *extra: str, job: int = 4242) -> str:
    command = ["accelerate", "launch", "--config_file", config, "--num_machines", str(nodes), "--num_processes",
               str(8 * nodes), "--machine_rank", str(rank), "--main_process_ip", "gpu001", "--main_process_port",
               str(20000 + job % 20000), SCRIPT, "--config", RECIPE, *extra]
    return f"node {rank} (gpu{rank + 1:03d}): {shlex.join(command)} >> runs/slurm/{job}/node-{rank}.log"


def test_torchrun_dry_run_one_node():
    done = run_script("launch/torchrun.sh", RECIPE, SCRIPT, "train.max_steps=5")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"env ACCELERATE_MIXED_PRECISION=bf16 torchrun --standalone --nproc_per_node 8 {SCRIPT} --config {RECIPE} "
        "train.max_steps=5"]


def test_torchrun_dry_run_on_each_of_two_nodes_keeps_the_global_batch():
    for rank in (0, 1):
        done = run_script("launch/torchrun.sh", RECIPE, SCRIPT, env={
            "NNODES": "2", "NODE_RANK": str(rank), "MASTER_ADDR": "gpu001", "GLOBAL_BATCH": "64"})
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == [
            f"env ACCELERATE_MIXED_PRECISION=bf16 torchrun --nnodes 2 --node_rank {rank} --master_addr gpu001 "
            f"--master_port 29500 --nproc_per_node 8 {SCRIPT} --config {RECIPE} train.grad_accum_steps=1"]


def test_torchrun_on_two_nodes_needs_the_rendezvous_address():
    done = run_script("launch/torchrun.sh", RECIPE, SCRIPT, env={"NNODES": "2", "NODE_RANK": "0"})
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines()[-1] == "torchrun.sh: set MASTER_ADDR (node 0's hostname, the same on every node)"


def test_slurm_one_node_dry_run():
    done = run_script("launch/slurm_1node.sbatch", RECIPE, SCRIPT, env=slurm_env(1))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [node_line(0, 1, "launch/deepspeed_zero2.yaml")]


def test_slurm_multi_node_dry_run_prints_every_node(tmp_path):
    # A fake scontrol expands the bracketed node list as SLURM's does.
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "scontrol").write_text('#!/usr/bin/env bash\n[[ "$1 $2" == "show hostnames" ]] && printf "gpu%03d\\n" 1 2 3\n')
    (fake / "scontrol").chmod(0o755)
    env = slurm_env(3, SLURM_JOB_NODELIST="gpu[001-003]")
    done = run_script("launch/slurm_multi_node.sbatch", RECIPE, SCRIPT, "logging.wandb=false", env=env, path_prefix=fake)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [node_line(r, 3, "launch/accelerate_multi_node.yaml", "logging.wandb=false")
                                        for r in range(3)]


def checkpoint(out: Path, step: int, complete: bool = True) -> None:
    """A checkpoint folder as the trainer leaves it: `complete` is written last."""
    folder = out / "checkpoints" / f"step-{step}"
    folder.mkdir(parents=True)
    if complete:
        (folder / "complete").write_text(f"step {step}\n")


def test_slurm_restart_resumes_and_global_batch_sets_the_accumulation(tmp_path):
    checkpoint(tmp_path, 100)
    env = slurm_env(2, SLURM_RESTART_COUNT="1", GLOBAL_BATCH="64")
    done = run_script("launch/slurm_multi_node.sbatch", RECIPE, SCRIPT, f"out={tmp_path}", env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        node_line(r, 2, "launch/accelerate_multi_node.yaml", f"out={tmp_path}", "resume=true",
                  "train.grad_accum_steps=1") for r in range(2)]


def test_slurm_restart_before_the_first_checkpoint_starts_over(tmp_path):
    # Requeued before any checkpoint was complete: resume=true would stop the trainer ("no complete
    # checkpoint"), so the restart runs the first job's command again. A folder without its `complete`
    # marker (killed while writing) and the trainer's temporary folder do not count.
    checkpoint(tmp_path, 100, complete=False)
    (tmp_path / "checkpoints" / ".step-200.tmp").mkdir()
    (tmp_path / "checkpoints" / ".step-200.tmp" / "complete").write_text("step 200\n")
    env = slurm_env(1, SLURM_RESTART_COUNT="1")
    done = run_script("launch/slurm_1node.sbatch", RECIPE, SCRIPT, f"out={tmp_path}", env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [node_line(0, 1, "launch/deepspeed_zero2.yaml", f"out={tmp_path}")]
    assert f"no complete checkpoint in {tmp_path}/checkpoints yet: starting the run from step 0" in done.stderr


@pytest.mark.parametrize("complete", [False, True])
def test_slurm_restart_reads_out_from_the_recipe(tmp_path, complete):
    """Without an out= override the recipe's own `out` is the folder looked in."""
    recipe = tmp_path / "sft.yaml"
    data = yaml.safe_load((REPO / RECIPE).read_text())
    data["out"] = str(tmp_path / "run")
    recipe.write_text(yaml.safe_dump(data))
    if complete:
        checkpoint(tmp_path / "run", 7)
    done = run_script("launch/slurm_1node.sbatch", str(recipe), SCRIPT, env=slurm_env(1, SLURM_RESTART_COUNT="2"))
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    assert line.split(" >> ")[0].endswith(f"--config {recipe}" + (" resume=true" if complete else ""))


def test_slurm_first_run_never_resumes(tmp_path):
    checkpoint(tmp_path, 100)
    done = run_script("launch/slurm_1node.sbatch", RECIPE, SCRIPT, f"out={tmp_path}", env=slurm_env(1))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [node_line(0, 1, "launch/deepspeed_zero2.yaml", f"out={tmp_path}")]


def test_slurm_refuses_a_bad_launch_before_printing_any_node(tmp_path):
    bad = write_config(tmp_path, deepspeed_config__zero_stage=4)
    done = run_script("launch/slurm_multi_node.sbatch", RECIPE, SCRIPT, env=slurm_env(2, LAUNCH_CONFIG=bad))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        f"fic launch-check: error: {bad}: field 'deepspeed_config.zero_stage': expected ZeRO stage 2 or 3, got 4"]
    done = run_script("launch/slurm_multi_node.sbatch", RECIPE, SCRIPT, env=slurm_env(2, GLOBAL_BATCH="40"))
    assert done.returncode == 2 and done.stdout == ""
    assert "a global batch of 40 conversations is not divisible by 16 processes" in done.stderr


def test_sbatch_headers_ask_for_requeue_and_an_early_signal():
    for script in ("launch/slurm_1node.sbatch", "launch/slurm_multi_node.sbatch"):
        directives = [line for line in (REPO / script).read_text().splitlines() if line.startswith("#SBATCH")]
        assert "#SBATCH --requeue" in directives and "#SBATCH --signal=B:USR1@300" in directives
        assert "#SBATCH --gres=gpu:8" in directives and "#SBATCH --ntasks-per-node=1" in directives


def fake_slurm(tmp_path: Path, srun_body: str) -> Path:
    """srun and scontrol stand-ins that record how they were called, and an accelerate that echoes."""
    fake = tmp_path / "bin"
    fake.mkdir()
    scripts = {
        "srun": f'#!/usr/bin/env bash\necho $$ > "{tmp_path}/srun.pid"\nprintf "%s\\n" "$@" > "{tmp_path}/srun.args"\n'
                + srun_body,
        "scontrol": f'#!/usr/bin/env bash\nif [[ "$1 $2" == "show hostnames" ]]; then tr , "\\n" <<< "$3"; exit; fi\n'
                    f'echo "$*" >> "{tmp_path}/scontrol.calls"\n',
        "accelerate": '#!/usr/bin/env bash\necho "accelerate $*"\n',
    }
    for name, body in scripts.items():
        (fake / name).write_text(body)
        (fake / name).chmod(0o755)
    return fake


def test_slurm_job_starts_on_every_node_what_the_dry_run_printed(tmp_path):
    # srun stand-in: past its own five options, run the command once per node, as SLURM does, with
    # that node's SLURM_NODEID.
    fake = fake_slurm(tmp_path, 'shift 5\nfor r in 0 1; do SLURM_NODEID=$r "$@"; done\n')
    env = slurm_env(2, LOG_DIR=str(tmp_path / "logs"), SLURM_JOB_NODELIST="gpu001,gpu002")
    printed = run_script("launch/slurm_multi_node.sbatch", RECIPE, SCRIPT, env=env).stdout.splitlines()
    done = run_script("launch/slurm_multi_node.sbatch", RECIPE, SCRIPT, env=env, path_prefix=fake, dry_run=False)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "srun.args").read_text().split() == [
        "--nodes", "2", "--ntasks-per-node", "1", "--kill-on-bad-exit=1", "bash", "launch/slurm_node.sh", RECIPE, SCRIPT]
    for rank, line in enumerate(printed):
        log = (tmp_path / "logs" / f"node-{rank}.log").read_text().splitlines()
        assert log[0].startswith("=== ") and log[0].endswith(f"job 4242 restart 0, node {rank} on {os.uname().nodename}")
        command = line.split(": ", 1)[1].rsplit(" >> ", 1)[0]
        assert log[1] == command


def test_usr1_before_the_time_limit_requeues_the_job(tmp_path):
    fake = fake_slurm(tmp_path, "exec sleep 30 </dev/null >/dev/null 2>&1\n")  # not holding our pipes open
    env = script_env(slurm_env(1, LOG_DIR=str(tmp_path / "logs")), path_prefix=fake, dry_run=False)
    job = subprocess.Popen(["bash", "launch/slurm_1node.sbatch", RECIPE, SCRIPT], cwd=REPO, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "srun.args").exists():
            assert job.poll() is None and time.monotonic() < deadline, job.communicate()
            time.sleep(0.05)
        job.send_signal(signal.SIGUSR1)
        out, err = job.communicate(timeout=30)
        assert job.returncode == 0, err
        assert (tmp_path / "scontrol.calls").read_text() == "requeue 4242\n"
        assert "requeueing (the restart resumes from the newest complete checkpoint)" in out
    finally:
        if job.poll() is None:
            job.kill()
        pid = (tmp_path / "srun.pid").read_text().strip() if (tmp_path / "srun.pid").exists() else ""
        if pid:
            try:
                os.kill(int(pid), signal.SIGTERM)
            except ProcessLookupError:
                pass


# --------------------------------------------------------------------------- the GPU smoke check

GPU_CHECKS = ["gpu", "setup", "sft-bf16", "vasd-bf16", "zero2-sft", "zero2-vasd", "vllm-logprobs"]


def gpu_check(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    return run_script("tools/gpu/gpu_check.sh", env={"OUT": str(tmp_path / "out"), **env})


def dry_commands(stdout: str) -> list[tuple[str, list[str]]]:
    """(check, argv without the `timeout N` prefix) for each command a dry run prints."""
    commands = []
    for line in stdout.splitlines():
        check, _, command = line.partition(": ")
        if check in GPU_CHECKS and command.startswith("timeout "):
            argv = shlex.split(command)
            assert argv[1].isdigit()
            commands.append((check, argv[2:]))
    return commands


def recipe_and_overrides(argv: list[str]) -> tuple[str, list[str]]:
    at = argv.index("--config")
    return argv[at + 1], argv[at + 2:]


@pytest.mark.parametrize("tools", ["vllm+deepspeed", "neither"])
def test_gpu_check_dry_run_prints_every_command(tmp_path, tools):
    from fic.cli.launch_check import check as launch_check
    from fic.core.config import load_config
    from fic.corpus.build import SFTDataConfig
    from fic.training.sft import SFTConfig
    from fic.training.vasd.config import VASDConfig

    both = tools == "vllm+deepspeed"
    done = gpu_check(tmp_path, VLLM="1" if both else "0", DEEPSPEED="1" if both else "0")
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "out").exists(), "a dry run wrote files"
    commands = dry_commands(done.stdout)
    assert [c for c, _ in commands] == ["gpu", "setup", "setup", "sft-bf16", "vasd-bf16"] + (
        ["zero2-sft", "zero2-sft", "zero2-vasd"] if both else [])
    out = str(tmp_path / "out")
    python = sys.executable
    assert commands[0][1][:2] == [python, "-c"] and "torch.cuda" in commands[0][1][2]
    assert commands[1][1] == [python, "-m", "fic", "prepare-model"]
    corpus = load_config(SFTDataConfig, *recipe_and_overrides(commands[2][1]))
    assert corpus.out == f"{out}/sft.jsonl" and corpus.data.limit == 32

    # Every training command's settings load with the trainer's own config class.
    configs = {}
    for check, argv in commands[3:]:
        if argv[:3] == [python, "-m", "fic"] and argv[3:5] == ["train", "sft"]:
            cls = SFTConfig
        elif argv[:3] == [python, "-m", "fic"] and argv[3:5] == ["train", "vasd"]:
            cls = VASDConfig
        elif argv[:3] == [python, "-m", "accelerate.commands.launch"]:
            assert argv[3:8] == ["--config_file", "launch/deepspeed_zero2.yaml", "--num_processes", "1",
                                 f"fic/train_{check.split('-')[1]}.py"]
            cls = SFTConfig if check == "zero2-sft" else VASDConfig
            recipe, overrides = recipe_and_overrides(argv)
            launch_check(REPO / "launch/deepspeed_zero2.yaml", REPO / recipe, num_processes=1, overrides=overrides)
        else:
            assert argv[3] == "launch-check" and check == "zero2-sft", argv
            continue
        configs[check] = load_config(cls, *recipe_and_overrides(argv))
    sft, vasd = configs["sft-bf16"], configs["vasd-bf16"]
    for config in (sft, vasd):
        assert (config.model.dtype, config.train.mixed_precision) == ("float32", "bf16")
        assert config.train.max_steps == 3 and not config.logging.wandb
    assert sft.data.path == corpus.out and sft.out == f"{out}/sft"
    assert vasd.model.path == f"{out}/sft/final" and vasd.anchor.path == corpus.out
    assert vasd.rollout.backend == ("vllm" if both else "hf")
    if both:
        assert configs["zero2-sft"].train.mixed_precision == "auto"  # bf16 from the launch file
        assert configs["zero2-vasd"].rollout.backend == "vllm"
        assert configs["zero2-vasd"].model.path == vasd.model.path
        assert any(line.startswith("vllm-logprobs: reads ") for line in done.stdout.splitlines())
    else:
        assert done.stdout.splitlines()[-3:] == [f"SKIP {check:<13} {why}" for check, why in [
            ("zero2-sft", "DEEPSPEED=0"), ("zero2-vasd", "DEEPSPEED=0"),
            ("vllm-logprobs", "VLLM=0; the rollouts ran on hf")]]


@pytest.mark.slow  # runs the smoke check's script
def test_gpu_check_without_a_gpu_fails_in_one_line_and_skips_the_rest(tmp_path):
    done = gpu_check(tmp_path, DRY_RUN="0", CUDA_VISIBLE_DEVICES="", VLLM="0", DEEPSPEED="0")
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split()[:2] for line in lines] == [["FAIL", "gpu"]] + [["SKIP", c] for c in GPU_CHECKS[1:]]
    assert all(line.endswith("no GPU") for line in lines[1:])
    assert (tmp_path / "out" / "gpu.log").is_file()


@pytest.mark.parametrize("deepspeed", ["1", "0"])
def test_gpu_check_random_weights_needs_nothing_prepared(tmp_path, deepspeed):
    """WEIGHTS=random: the set-up builds a random-weight model of SmolLM2-135M's shape with the carried
    tokenizer and writes the corpus with actions-gen (no GGUF, hub or reasoning-gym); the training
    steps start from that model and VASD plays actions-gen instances; the log-prob check is skipped."""
    from fic.cli.launch_check import check as launch_check
    from fic.core.config import load_config
    from fic.training.sft import SFTConfig
    from fic.training.vasd.config import VASDConfig

    done = gpu_check(tmp_path, WEIGHTS="random", TOKENIZER="carry/tokenizer", VLLM="1", DEEPSPEED=deepspeed)
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "out").exists(), "a dry run wrote files"
    commands = dry_commands(done.stdout)
    out, python = str(tmp_path / "out"), sys.executable
    assert [c for c, _ in commands][:3] == ["gpu", "setup", "setup"]
    assert commands[1][1] == [python, "-m", "fic.bench.random_weights", "--out", f"{out}/model", "--tokenizer",
                              "carry/tokenizer", "--device", "cuda"]
    assert commands[2][1] == [python, "-m", "fic", "sft-data", "data.source=[actions-gen:train]", "data.task=actions",
                              "data.limit=32", f"out={out}/sft.jsonl"]
    configs = {}
    for check, argv in commands[3:]:
        if "launch-check" in argv:
            continue
        cls = SFTConfig if "sft" in check else VASDConfig
        configs[check] = load_config(cls, *recipe_and_overrides(argv))
        if check.startswith("zero2"):
            recipe, overrides = recipe_and_overrides(argv)
            launch_check(REPO / "launch/deepspeed_zero2.yaml", REPO / recipe, num_processes=1, overrides=overrides)
            assert configs[check].model.dtype == "bfloat16"  # DeepSpeed's bf16 and the teacher copy agree
    assert set(configs) == {"sft-bf16", "vasd-bf16"} | ({"zero2-sft", "zero2-vasd"} if deepspeed == "1" else set())
    assert configs["sft-bf16"].model.path == f"{out}/model"
    vasd = configs["vasd-bf16"]
    assert vasd.data.source == ["actions-gen:train"] and vasd.data.task == "actions" and vasd.exclude.sources == []
    assert vasd.loss.keep_truncated and vasd.rollout.max_new_tokens == 64 and vasd.rollout.backend == "vllm"
    assert done.stdout.splitlines()[-1].startswith("SKIP vllm-logprobs WEIGHTS=random")


def test_gpu_check_refuses_unknown_weights(tmp_path):
    done = gpu_check(tmp_path, WEIGHTS="pretrained")
    assert done.returncode == 2 and "WEIGHTS must be bundled or random" in done.stderr


def session_commands(stdout: str) -> dict[str, list[list[str]]]:
    """phase -> the argv of each command the session's dry run prints (its own and its phases')."""
    found: dict[str, list[list[str]]] = {}
    for line in stdout.splitlines():
        head, sep, command = line.partition(" ")
        if not sep or not head.endswith((":", ">")) or head.startswith(("SKIP", "gpu_session")):
            continue
        if head.endswith(">"):  # a phase's own dry run: `smoke> check: command` or `zero2> command`
            inner, sep, rest = command.partition(": ")
            command = rest if sep and inner in GPU_CHECKS else command
        argv = shlex.split(command)
        found.setdefault(head.rstrip(":>"), []).append(argv[2:] if argv[:1] == ["timeout"] else argv)
    return found


@pytest.mark.slow  # end to end: the session script's plan
def test_gpu_session_dry_run_prints_every_phase(tmp_path):
    """DRY_RUN=1: every phase's command, and the commands inside each phase (the smoke check's, each
    bench's), runs nothing and writes nothing; every trainer command loads with its trainer's config
    and every DeepSpeed one passes the launch check."""
    from fic.cli.launch_check import check as launch_check
    from fic.core.config import load_config
    from fic.training.sft import SFTConfig
    from fic.training.vasd.config import VASDConfig

    env = {"OUT": str(tmp_path / "out"), "CARRY": "carry", "SCRATCH": str(tmp_path / "scratch"),
           "SHAPES": "llama-3.2-3b-instruct"}
    done = subprocess.run(["bash", "tools/gpu/gpu_session.sh"], cwd=REPO, env=script_env(env), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "scratch").exists(), "a dry run wrote files"
    phases = session_commands(done.stdout)
    assert list(phases) == ["env", "install", "smoke", "zero2", "zero3", "decode", "shape:llama-3.2-3b-instruct",
                            "report"]
    python = sys.executable
    assert phases["install"][0][:9] == [python, "-m", "pip", "install", "--no-index", "--no-deps", "--find-links",
                                        "carry/wheels", "--target"]
    assert "deepspeed" in phases["install"][0] and "msgpack" in phases["install"][0]
    assert phases["zero2"][0][:6] == [python, "-m", "fic", "bench", "zero", "--stage"]
    assert phases["report"] == [[python, "tools/gpu/report.py", str(tmp_path / "out")]]
    # decode: the 3B shape's config unwrapped from its shape file, then the bench reads it as a config.json
    unwrap, decode = phases["decode"]
    assert decode[:5] == [python, "-m", "fic", "bench", "decode"] and decode[decode.index("--device") + 1] == "cuda"
    config_json = tmp_path / "decode-config.json"
    subprocess.run([*unwrap[:-1], str(config_json)], cwd=REPO, check=True, timeout=60)
    fields = json.loads(config_json.read_text())
    from transformers import AutoConfig

    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    assert (config.hidden_size, config.num_hidden_layers) == (3072, 28)  # Llama-3.2-3B
    trainers = 0
    for phase, commands in phases.items():
        for argv in commands:
            if "--config" not in argv or "launch-check" in argv or "sft-data" in argv:
                continue
            recipe, overrides = recipe_and_overrides(argv)
            cls = {"sft.yaml": SFTConfig, "vasd.yaml": VASDConfig}[Path(recipe).name]
            cfg = load_config(cls, REPO / recipe, overrides)
            assert not cfg.logging.wandb, (phase, argv)
            if "--config_file" in argv:
                launch = argv[argv.index("--config_file") + 1]
                launch_check(REPO / launch, REPO / recipe, num_processes=1,
                             overrides=[o for o in overrides if o != "resume=true"])
            trainers += 1
    # smoke: sft, vasd, zero2 sft and vasd; zero2 and zero3: run and resume of each; the shape: sft, vasd
    assert trainers == 4 + 2 * 4 + 2


def test_gpu_carry_dry_run_names_what_travels():
    done = run_script("tools/gpu/gpu_carry.sh", env={"CARRY": "carry"})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any(line.endswith("tokenizer models/smollm2-135m-instruct carry/tokenizer") for line in lines)
    assert any("DS_BUILD_OPS=0" in line and "deepspeed==0.19.8" in line for line in lines)
    binary = [line for line in lines if "--only-binary=:all:" in line]
    assert len(binary) == 5 and all("msgpack pydantic-core" in line for line in binary)
    assert not (REPO / "carry").exists()


@pytest.mark.slow  # end to end: the GPU session's every phase on CPU
def test_gpu_session_rehearsal_on_cpu(tmp_path, smollm2_dir):
    """The session for real on this CPU, its GPU-only phases left out: the ZeRO bench as one plain
    process (SFT, 2 steps, resumed) and one tiny backbone shape, then the report. Its lines, OUT's
    files and the tables come out as on the lent machine, and the scratch folder is gone."""
    from fic.bench.random_weights import copy_tokenizer

    carry = tmp_path / "carry"
    copy_tokenizer(smollm2_dir, carry / "tokenizer")
    tiny = ("--layers 2 --set=hidden_size=32 --set=intermediate_size=64 --set=num_attention_heads=2 "
            "--set=num_key_value_heads=1 --set=head_dim=16")
    env = {"OUT": str(tmp_path / "out"), "CARRY": str(carry), "SCRATCH": str(tmp_path / "scratch"),
           "PHASES": "zero2,shapes,report", "SHAPES": "phi-4", "BUDGET_S": "900",
           "ZERO_ARGS": f"{tiny} --launcher plain --methods sft --steps 2 --override model.dtype=float32",
           "SHAPE_ARGS": f"{tiny} --stages sft --sft-steps 2 --corpus-size 16 --override train.micro_batch_size=2 "
                         "--override train.grad_accum_steps=1 --override model.dtype=float32 --peak-tflops 1"}
    done = subprocess.run(["bash", "tools/gpu/gpu_session.sh"], cwd=REPO, env=script_env(env, dry_run=False),
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line.split()[:2] for line in done.stdout.splitlines() if line.startswith(("PASS", "FAIL", "SKIP"))]
    assert lines == [["PASS", "zero2"], ["PASS", "shape:phi-4"], ["PASS", "report"]], done.stdout
    out = tmp_path / "out"
    zero = json.loads((out / "zero2.json").read_text())["methods"]["sft"]
    assert zero["ok"] and zero["identical"] and zero["resumed_losses"] == zero["losses"][1:]
    assert zero["checkpoint"]["path"].endswith("checkpoints/step-1") and "model.safetensors" in zero["final"]
    shape = json.loads((out / "shape-phi-4.json").read_text())
    assert shape["stages"]["sft"]["ok"] and shape["stages"]["sft"]["lora_r"] == 32
    assert (out / "shapes/phi-4/sft-probe.json").is_file() and (out / "shapes/phi-4/sft-run.metrics.jsonl").is_file()
    assert (out / "zero2/sft-resumed.metrics.jsonl").is_file()
    table = (out / "gpu_table.md").read_text()
    assert "| phi-4 | sft | plain | 2 of 40 | 2 x 1 | 32 | off |" in table
    assert "| ZeRO-2 | sft | plain | 2 |" in table and "| identical | Accelerate | PASS |" in table
    assert [row.split("\t")[:2] for row in (out / "phases.tsv").read_text().splitlines()] == [
        ["zero2", "PASS"], ["shape:phi-4", "PASS"], ["report", "PASS"]]
    assert not (tmp_path / "scratch").exists()
    assert sum(f.stat().st_size for f in out.rglob("*") if f.is_file()) < 5 * 2**20  # logs and figures only
