"""The sandbox mode: bubblewrap by default, the weaker rlimits fallback only when asked for, and a
mode that cannot hold something on this machine refuses to run unless the user names the gap."""

import pytest
from sandboxed import ROOMY, ROOT

from fic.core.errors import FicError
from fic.sandbox import bubblewrap
from fic.sandbox import python as sandbox
from fic.sandbox.python import run_python


def test_without_bubblewrap_model_code_is_refused_unless_the_fallback_is_asked_for(monkeypatch):
    monkeypatch.setattr(bubblewrap, "_bwrap", lambda: (None, "no user namespaces here"))
    monkeypatch.delenv(sandbox.POLICY_VARIABLE, raising=False)
    with pytest.raises(sandbox.SandboxUnavailable, match="no user namespaces here.*sandbox=rlimits"):
        run_python("print(1)\n")
    with sandbox.use_mode("rlimits"):
        assert run_python("print(1)\n", ROOMY).passed
    monkeypatch.setenv(sandbox.POLICY_VARIABLE, "rlimits")
    assert run_python("print(1)\n", ROOMY).passed and sandbox.weak_warning() == sandbox.WEAK_WARNING
    monkeypatch.setenv(sandbox.POLICY_VARIABLE, "none")
    with pytest.raises(FicError, match="expected bubblewrap or rlimits"):
        run_python("print(1)\n")


def test_a_mode_that_cannot_hold_something_here_refuses_to_run_unless_the_user_names_it(monkeypatch):
    # Without Landlock (Linux < 5.13) the rlimits mode does not hold files outside the folder, and
    # without a seccomp table (another architecture) not the network (nor, for a user other than
    # root, other processes); bubblewrap's namespaces hold them.
    monkeypatch.delenv(sandbox.UNHELD_VARIABLE, raising=False)
    assert sandbox.unheld("rlimits") == {} and sandbox.unheld("bubblewrap") == {}  # this machine: all held
    monkeypatch.setattr(sandbox, "landlock_abi", lambda: 0)
    with pytest.raises(sandbox.SandboxUnavailable, match=r"rlimits sandbox cannot hold here: files: no Landlock.*"
                                                         rf"{sandbox.UNHELD_VARIABLE}=files "):
        run_python("print(1)\n", ROOMY, isolation="rlimits")
    with sandbox.use_mode("rlimits"), pytest.raises(sandbox.SandboxUnavailable, match="files: no Landlock"):
        sandbox.check_mode()  # what `fic eval` asks before it plays
    monkeypatch.setenv(sandbox.UNHELD_VARIABLE, "files")
    assert run_python("print(1)\n", ROOMY, isolation="rlimits").passed
    with sandbox.use_mode("rlimits"):
        assert "does NOT hold files (no Landlock" in sandbox.describe_isolation()
    monkeypatch.setattr(sandbox.platform, "machine", lambda: "riscv64")
    gaps = sandbox.unheld("rlimits")
    assert set(gaps) == {"files", "network"} | (set() if ROOT else {"processes"}) | (
        set() if sandbox._may_unshare_ipc() else {"ipc"}) and "riscv64" in gaps["network"]
    monkeypatch.setattr(sandbox, "_may_unshare_ipc", lambda: False)  # a container without CAP_SYS_ADMIN
    assert "no IPC namespace (no CAP_SYS_ADMIN) and no seccomp table for riscv64" in sandbox.unheld("rlimits")["ipc"]
    with pytest.raises(sandbox.SandboxUnavailable, match="network: no seccomp table for riscv64"):
        run_python("print(1)\n", ROOMY, isolation="rlimits")
    if sandbox.bwrap_command():
        assert run_python("print(1)\n", ROOMY, isolation="bubblewrap").passed
    monkeypatch.setenv(sandbox.UNHELD_VARIABLE, "files,everything")
    with pytest.raises(FicError, match="FIC_SANDBOX_UNHELD.*expected a comma-separated list"):
        run_python("print(1)\n", ROOMY, isolation="rlimits")
