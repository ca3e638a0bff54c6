"""The sandbox's in-process guard, run as `python -I -S -B guard.py` in the run's folder by the
supervisor (`fic/sandbox/launcher.py`); `fic.sandbox.python` copies this file there. Standard
library only: it runs with `-I -S`, outside FiC's environment.

It installs a Python audit hook that refuses, with one line on stderr each, what model-written
code has no business doing (files outside its folder, sockets, programs, `ctypes`, signals and
limits aimed at other processes, walks of `gc`'s objects, forks past the limit), then runs
`program.py` as `__main__` and, when the program returned, prints the run's nonce: the sign that
the program ran to its end. Defence in depth, never the boundary: pure Python can switch a hook
off, and the operating system's layers hold without it (`FIC_SANDBOX_GUARD=off` leaves the hook
out, as the tests do to show that).
"""

import os
import sys

REFUSED = "fic-sandbox: refused "  # the prefix of every refusal on stderr
DONE = "fic-sandbox: done "        # printed with the run's nonce after the program returned


def install(max_forks):
    """Add the audit hook. `refuse` is a closure of the hook on purpose: the hostile suite's
    `gc` attack looks for it there (and the hook refuses the walk that would find it)."""
    import fcntl

    root = os.path.realpath(os.getcwd())
    readable = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    devices = {"/dev/null", "/dev/urandom", "/dev/random", "/dev/zero"}
    counter = os.open(os.path.join(root, ".fic_forks"), os.O_RDWR | os.O_CREAT, 0o600)
    me = os.getpid

    def refuse(what):
        os.write(2, (REFUSED + what + "\n").encode())
        raise PermissionError("fic sandbox: " + what)

    def inside(path, bases):
        if isinstance(path, int) or path is None:
            return True
        path = os.path.realpath(os.fsdecode(path))
        return any(path == b or path.startswith(b.rstrip("/") + "/") for b in bases)

    def check(path, write):
        if not write and (inside(path, readable | {root}) or os.path.realpath(os.fsdecode(path)) in devices):
            return
        if write and inside(path, {root}):
            return
        refuse(("writing " if write else "reading ") + os.fsdecode(path) + " (outside its folder)")

    writers = {"os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.truncate", "os.utime",
               "shutil.rmtree", "os.chflags", "os.setxattr", "os.removexattr"}
    pairs = {"os.rename", "os.link", "os.symlink", "shutil.copyfile", "shutil.copytree", "shutil.move"}
    programs = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.startfile",
                "pty.spawn", "os.fork_exec")
    modules = {"ctypes", "_ctypes", "cffi", "_posixsubprocess"}

    def hook(event, args):
        if event == "open":
            path, mode, flags = args
            write = (mode is not None and any(c in str(mode) for c in "wax+")) or \
                bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND))
            if not isinstance(path, int):
                check(path, write)
        elif event in writers:
            check(args[0], True)
        elif event in pairs:
            check(args[0], event != "os.symlink" and event != "shutil.copyfile")
            check(args[1], True)
        elif event in ("os.listdir", "os.scandir", "os.chdir"):
            check(args[0] if args and args[0] is not None else ".", False)
        elif event.startswith("socket."):
            refuse("network access (" + event + ")")
        elif event in ("gc.get_objects", "gc.get_referrers", "gc.get_referents"):
            refuse("walking the interpreter's objects (" + event + "), the way to this guard")
        elif event.startswith(programs):
            refuse("starting a program (" + event + ")")
        elif event == "import" and args[0] in modules:
            refuse("importing " + args[0])
        elif event in ("os.kill", "os.killpg", "signal.pthread_kill"):
            if event != "os.kill" or args[0] not in (0, me()):
                refuse("a signal to another process (" + event + " " + str(args[0]) + ")")
        elif event == "resource.prlimit" and args[0] not in (0, me()):
            refuse("the limits of another process (resource.prlimit " + str(args[0]) + ")")
        elif event in ("os.fork", "os.forkpty"):
            fcntl.flock(counter, fcntl.LOCK_EX)
            try:
                forks = int(os.pread(counter, 32, 0) or b"0") + 1
                os.pwrite(counter, str(forks).encode().ljust(32), 0)
            finally:
                fcntl.flock(counter, fcntl.LOCK_UN)
            if forks > max_forks:
                refuse("process " + str(forks) + " (the limit is " + str(max_forks) + ")")

    sys.addaudithook(hook)


def main():
    nonce = os.environ.pop("FIC_SANDBOX_NONCE", "")
    max_forks = int(os.environ.pop("FIC_SANDBOX_FORKS", "16"))
    if os.environ.pop("FIC_SANDBOX_GUARD", "on") != "off":
        install(max_forks)
    with open("program.py", encoding="utf-8") as handle:
        program = handle.read()
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    exec(compile(program, "program.py", "exec"), namespace)  # noqa: S102 (running the program is the purpose)
    print("\n" + DONE + nonce, flush=True)


if __name__ == "__main__":
    main()
