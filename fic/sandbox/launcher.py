"""The sandbox's supervisor, run as `python -I -S -B launcher.py CONFIG VERDICT_FD` by
`fic.sandbox.python`, inside bubblewrap or (the rlimits fallback) directly. Standard library
only: it runs with `-I -S`, outside FiC's environment.

It makes itself a child subreaper (every orphan of the program, a `setsid` daemon included,
becomes its child instead of init's), gives the run an IPC namespace of its own where it has none
yet (bubblewrap made one; in the rlimits mode `unshare` where permitted), forks the program and,
in the child before `exec`, applies the operating-system layers the config asks for:

1. its own process group; resource limits (address space, CPU seconds per process, file size,
   open files, no core files, and the number of processes: the kernel enforces it for any user
   but root, which is why a root evaluator drops to a per-run user id);
2. that user id (`setresuid`/`setresgid`, no supplementary groups), when the config gives one,
   keeping CAP_DAC_READ_SEARCH alone (ambient) where that id could not reach the interpreter;
3. death with the supervisor (`PR_SET_PDEATHSIG`) and `PR_SET_NO_NEW_PRIVS`; the supervisor in
   turn kills the whole tree when the evaluator ends (its own death signal, in the rlimits mode;
   bubblewrap's `--die-with-parent` ends the PID namespace);
4. Landlock (Linux 5.13+), where the kernel has it: reading only the Python installation and the
   system's libraries, writing only the run's folder; with ABI 4+ no TCP bind or connect; with
   ABI 6+ no signals to processes outside the sandbox and no abstract unix sockets outside it;
5. a seccomp filter (x86-64, arm64): no sockets, ptrace, process_vm_*, pidfd_*, namespaces
   (unshare, setns, clone with CLONE_NEW*; clone3 answers ENOSYS so libc falls back to clone),
   mounts, io_uring, bpf, perf, keyrings, kernel modules, kexec, reboot, clocks, swap,
   memfd_create (memory no process's resident size shows), setpriority, ioprio_set; and kill,
   tkill, tgkill, rt_*sigqueueinfo, prlimit64, sched_set*, migrate_pages, move_pages and
   get_robust_list only on the program itself (0, its pid, its process group): never on the
   supervisor, the evaluator or any other process of the machine, whatever the user id; and,
   where the run could get no IPC namespace of its own, SysV IPC (shmget, shmat, msgget, semget
   and the rest): the process that asks is killed (SIGSYS), so that the refusal is never silent.

Then it watches the program: the CPU time of the whole process tree (live processes from
/proc, finished ones from wait4) against the CPU limit, the resident memory of the whole tree and
the SysV IPC objects of the run's namespace (shared memory no process maps, message queues,
semaphores: memory that belongs to no process) against the tree's memory limit, what the run
added to its folder (bytes and a page for each file or folder; a tmpfs of its own in bubblewrap)
against the folder's limit, the wall clock against the wall limit. The namespace, and whatever the run created in it, ends with the run. When the program ends,
or a limit is reached, it kills every process still in its tree and counts those that were left
running. The verdict goes to VERDICT_FD as one JSON object.
"""

import ctypes
import json
import os
import platform
import resource
import signal
import stat
import struct
import sys
import time

PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, PR_SET_CHILD_SUBREAPER = 1, 38, 22, 36
PR_SET_KEEPCAPS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE = 8, 47, 2
CAP_DAC_READ_SEARCH, CAPABILITY_VERSION_3 = 2, 0x20080522
SECCOMP_MODE_FILTER = 2
RET_ALLOW, RET_ERRNO, RET_KILL_PROCESS = 0x7FFF0000, 0x00050000, 0x80000000
EPERM, ENOSYS = 1, 38
LD_W_ABS, JEQ_K, JGE_K, JSET_K, RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
NAMESPACE_FLAGS = 0x10000000 | 0x00020000 | 0x20000000 | 0x40000000 | 0x08000000 | 0x04000000 | 0x02000000

# (audit arch, denied syscalls, clone, clone3, syscalls aimed at a process: {number: (argument, targets)})
# Targets: "self" allows 0 and the program's own pid; "group" also its process group (-pid).
# The kernel's answer to a call aimed at any other process is EPERM, whatever the caller's user id.
SYSCALLS = {
    "x86_64": (0xC000003E, {
        "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "pidfd_open": 434, "pidfd_getfd": 438,
        "pidfd_send_signal": 424, "process_madvise": 440, "kcmp": 312, "mount": 165, "umount2": 166,
        "pivot_root": 155, "chroot": 161, "unshare": 272, "setns": 308, "socket": 41, "io_uring_setup": 425,
        "io_uring_enter": 426, "io_uring_register": 427, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323,
        "keyctl": 250, "add_key": 248, "request_key": 249, "kexec_load": 246, "kexec_file_load": 320,
        "init_module": 175, "finit_module": 313, "delete_module": 176, "open_by_handle_at": 304,
        "name_to_handle_at": 303, "fanotify_init": 300, "quotactl": 179, "swapon": 167, "swapoff": 168,
        "reboot": 169, "acct": 163, "settimeofday": 164, "clock_settime": 227, "adjtimex": 159,
        "clock_adjtime": 305, "iopl": 172, "ioperm": 173, "syslog": 103, "personality": 135,
        "lookup_dcookie": 212, "vhangup": 153, "move_mount": 429, "open_tree": 428, "fsopen": 430,
        "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442, "setpriority": 141,
        "ioprio_set": 251, "memfd_create": 319}, 56, 435, {
        62: (0, "group"), 200: (0, "self"), 234: (0, "self"), 129: (0, "self"), 297: (0, "self"),  # signals
        302: (0, "self"), 203: (0, "self"), 142: (0, "self"), 144: (0, "self"), 314: (0, "self"),  # prlimit64, sched_*
        256: (0, "self"), 279: (0, "self"), 274: (0, "self")}),  # migrate_pages, move_pages, get_robust_list
    "aarch64": (0xC00000B7, {
        "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "pidfd_open": 434, "pidfd_getfd": 438,
        "pidfd_send_signal": 424, "process_madvise": 440, "kcmp": 272, "mount": 40, "umount2": 39,
        "pivot_root": 41, "chroot": 51, "unshare": 97, "setns": 268, "socket": 198, "io_uring_setup": 425,
        "io_uring_enter": 426, "io_uring_register": 427, "bpf": 280, "perf_event_open": 241, "userfaultfd": 282,
        "keyctl": 219, "add_key": 217, "request_key": 218, "kexec_load": 104, "kexec_file_load": 294,
        "init_module": 105, "finit_module": 273, "delete_module": 106, "open_by_handle_at": 265,
        "name_to_handle_at": 264, "fanotify_init": 262, "quotactl": 60, "swapon": 224, "swapoff": 225,
        "reboot": 142, "acct": 89, "settimeofday": 170, "clock_settime": 112, "adjtimex": 171,
        "clock_adjtime": 266, "syslog": 116, "personality": 92, "lookup_dcookie": 18, "vhangup": 58,
        "move_mount": 429, "open_tree": 428, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
        "mount_setattr": 442, "setpriority": 140, "ioprio_set": 30, "memfd_create": 279}, 220, 435, {
        129: (0, "group"), 130: (0, "self"), 131: (0, "self"), 138: (0, "self"), 240: (0, "self"),
        261: (0, "self"), 122: (0, "self"), 118: (0, "self"), 119: (0, "self"), 274: (0, "self"),
        238: (0, "self"), 239: (0, "self"), 100: (0, "self")}),
}

# SysV IPC, refused where the run has no IPC namespace of its own (neither architecture has the
# ipc() multiplexer; a 32-bit process on x86-64 fails the architecture check and is killed).
SYSV_IPC = {
    "x86_64": {"shmget": 29, "shmat": 30, "shmctl": 31, "shmdt": 67, "semget": 64, "semop": 65, "semctl": 66,
               "semtimedop": 220, "msgget": 68, "msgsnd": 69, "msgrcv": 70, "msgctl": 71},
    "aarch64": {"msgget": 186, "msgctl": 187, "msgrcv": 188, "msgsnd": 189, "semget": 190, "semctl": 191,
                "semtimedop": 192, "semop": 193, "shmget": 194, "shmctl": 195, "shmat": 196, "shmdt": 197},
}
CLONE_NEWIPC = 0x08000000
PAGE = os.sysconf("SC_PAGE_SIZE")

# Landlock
LL_CREATE_RULESET, LL_ADD_RULE, LL_RESTRICT_SELF = 444, 445, 446  # the same on x86-64 and arm64
LL_VERSION, LL_PATH_BENEATH = 1, 1
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
ALL_V1 = (1 << 13) - 1
REFER, TRUNCATE, IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV
MAKE_CHAR, MAKE_BLOCK = 1 << 6, 1 << 11
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX, SCOPE_SIGNAL = 1 << 0, 1 << 1

libc = ctypes.CDLL(None, use_errno=True)


def prctl(option, value, argument=0):
    if libc.prctl(option, ctypes.c_ulong(value), ctypes.c_ulong(argument), ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:
        raise OSError(ctypes.get_errno(), "prctl(%d) failed: %s" % (option, os.strerror(ctypes.get_errno())))


def keep_only_read_search():
    """After `setresuid` under PR_SET_KEEPCAPS: drop every capability but CAP_DAC_READ_SEARCH and
    keep that one across exec (ambient). It lets the run's user id read and search folders (the
    interpreter under a 0700 /root) and nothing else: no writes, no signals, no other user's
    limits; Landlock still bounds what it reads."""
    bit = 1 << CAP_DAC_READ_SEARCH
    header = ctypes.create_string_buffer(struct.pack("Ii", CAPABILITY_VERSION_3, 0), 8)
    data = ctypes.create_string_buffer(struct.pack("6I", bit, bit, bit, 0, 0, 0), 24)  # effective, permitted, inheritable
    if libc.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset: " + os.strerror(ctypes.get_errno()))
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, CAP_DAC_READ_SEARCH)


# --------------------------------------------------------------------------- seccomp

def seccomp_program(own, refuse_ipc=False):
    """The filter as bytes of `struct sock_filter`, or None on an architecture without a table.
    `own` is the program's pid (and process group): the only process besides 0 (the caller) that
    signals, prlimit64 and the scheduling calls may name. The rest of the tree is not expressible
    here (a forked child's pid is not known yet), so a child may not signal its own children.
    `refuse_ipc`: a SysV IPC call kills the process that makes it."""
    table = SYSCALLS.get(platform.machine())
    if table is None:
        return None
    arch, denied, clone, clone3, aimed = table
    ipc = SYSV_IPC[platform.machine()] if refuse_ipc else {}
    code = []  # (opcode, k, true label or None, false label or None); labels resolved below
    code.append((LD_W_ABS, 4, None, None))
    code.append((JEQ_K, arch, None, "kill"))
    code.append((LD_W_ABS, 0, None, None))
    code.append((JGE_K, 0x40000000, "enosys", None))  # the x32 ABI on x86-64
    code.append((JEQ_K, clone3, "enosys", None))
    for number in sorted(ipc.values()):
        code.append((JEQ_K, number, "kill", None))
    for number in sorted(set(denied.values())):
        code.append((JEQ_K, number, "eperm", None))
    code.append((JEQ_K, clone, "clone", None))
    for number, (argument, targets) in sorted(aimed.items()):
        code.append((JEQ_K, number, f"{targets}{argument}", None))
    code.append((RET_K, RET_ALLOW, None, None))
    labels = {"clone": len(code)}
    code.append((LD_W_ABS, 16, None, None))  # the low 32 bits of argument 0 (little-endian)
    code.append((JSET_K, NAMESPACE_FLAGS, "eperm", None))
    code.append((RET_K, RET_ALLOW, None, None))
    for targets, argument in sorted({(t, a) for a, t in aimed.values()}):
        labels[f"{targets}{argument}"] = len(code)
        code.append((LD_W_ABS, 16 + 8 * argument, None, None))  # a pid_t: the kernel reads the low 32 bits
        allowed = {0, own & 0xFFFFFFFF} | ({(-own) & 0xFFFFFFFF} if targets == "group" else set())
        for value in sorted(allowed):
            code.append((JEQ_K, value, "allow", None))
        code.append((RET_K, RET_ERRNO | EPERM, None, None))
    labels["allow"] = len(code)
    code.append((RET_K, RET_ALLOW, None, None))
    labels["eperm"] = len(code)
    code.append((RET_K, RET_ERRNO | EPERM, None, None))
    labels["enosys"] = len(code)
    code.append((RET_K, RET_ERRNO | ENOSYS, None, None))
    labels["kill"] = len(code)
    code.append((RET_K, RET_KILL_PROCESS, None, None))
    out = b""
    for index, (op, k, true, false) in enumerate(code):
        jt = 0 if true is None else labels[true] - index - 1
        jf = 0 if false is None else labels[false] - index - 1
        if not (0 <= jt <= 255 and 0 <= jf <= 255):
            raise ValueError("seccomp jump out of range")
        out += struct.pack("HBBI", op, jt, jf, k)
    return out


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def load_seccomp(program):
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    if libc.prctl(PR_SET_SECCOMP, ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "seccomp: " + os.strerror(ctypes.get_errno()))


# --------------------------------------------------------------------------- Landlock

def landlock_abi():
    libc.syscall.restype = ctypes.c_long
    abi = libc.syscall(ctypes.c_long(LL_CREATE_RULESET), None, ctypes.c_size_t(0), ctypes.c_uint32(LL_VERSION))
    return max(0, int(abi))


def landlock(abi, read_paths, write_paths, file_paths):
    """Restrict this process (and what it execs): read-only `read_paths`, read-write `write_paths`,
    read-write files `file_paths` (/dev/null); nothing else of the file system; no TCP; scoped
    signals and abstract unix sockets."""
    handled = ALL_V1 | (REFER if abi >= 2 else 0) | (TRUNCATE if abi >= 3 else 0) | (IOCTL_DEV if abi >= 5 else 0)
    net = (NET_BIND_TCP | NET_CONNECT_TCP) if abi >= 4 else 0
    scoped = (SCOPE_ABSTRACT_UNIX | SCOPE_SIGNAL) if abi >= 6 else 0
    attr = struct.pack("QQQ", handled, net, scoped)[:8 if abi < 4 else 16 if abi < 6 else 24]
    buffer = ctypes.create_string_buffer(attr, len(attr))
    ruleset = libc.syscall(ctypes.c_long(LL_CREATE_RULESET), buffer, ctypes.c_size_t(len(attr)), ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset: " + os.strerror(ctypes.get_errno()))
    readable = EXECUTE | READ_FILE | READ_DIR
    writable = handled & ~(MAKE_CHAR | MAKE_BLOCK)
    rules = [(p, readable) for p in read_paths] + [(p, writable) for p in write_paths] + \
        [(p, (READ_FILE | WRITE_FILE | (TRUNCATE if abi >= 3 else 0)) & handled) for p in file_paths]
    for path, access in rules:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue  # not on this machine
        try:
            if not os.path.isdir(path):
                access &= FILE_RIGHTS
            rule = struct.pack("=Qi", access & handled, fd)
            rule_buffer = ctypes.create_string_buffer(rule, len(rule))
            if libc.syscall(ctypes.c_long(LL_ADD_RULE), ctypes.c_int(ruleset), ctypes.c_int(LL_PATH_BENEATH),
                            rule_buffer, ctypes.c_uint32(0)) != 0:
                raise OSError(ctypes.get_errno(), "landlock_add_rule %s: %s" % (path, os.strerror(ctypes.get_errno())))
        finally:
            os.close(fd)
    if libc.syscall(ctypes.c_long(LL_RESTRICT_SELF), ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self: " + os.strerror(ctypes.get_errno()))
    os.close(ruleset)


# --------------------------------------------------------------------------- SysV IPC

def ipc_namespace():
    return os.readlink("/proc/self/ns/ipc")


def own_ipc_namespace(evaluator, allowed):
    """Whether the run has an IPC namespace of its own: bubblewrap made one (this process's is not
    the evaluator's), or `unshare` makes one now (where `allowed` and permitted: CAP_SYS_ADMIN)."""
    if ipc_namespace() != evaluator:
        return True
    return bool(allowed) and libc.unshare(ctypes.c_int(CLONE_NEWIPC)) == 0


SEMAPHORE, MESSAGE = 64, 64  # kernel bytes of one semaphore and of one message's header, about


def sysv_bytes():
    """The memory the SysV IPC objects of this namespace hold, which no process's resident size
    shows once detached: shared memory's resident and swapped bytes, queued messages, semaphores,
    and a page for each object."""
    total = 0
    for name, size in (("shm", lambda r: r["rss"] + r["swap"]), ("msg", lambda r: r["cbytes"] + MESSAGE * r["qnum"]),
                       ("sem", lambda r: SEMAPHORE * r["nsems"])):
        try:
            with open("/proc/sysvipc/" + name) as handle:
                header = handle.readline().split()
                for line in handle:
                    row = dict(zip(header, line.split()))
                    total += size({k: int(v) for k, v in row.items() if v.lstrip("-").isdigit()}) + PAGE
        except (OSError, KeyError, ValueError):
            continue
    return total


# --------------------------------------------------------------------------- the run's folder

def folder_usage(config, live, stop):
    """What the run's folder holds: bytes of its files plus a page for each file or folder (an
    inode of a tmpfs is memory too), or None when the program made part of it unreadable. On a
    file system of its own (bubblewrap's tmpfs) that file system's count, which includes files
    removed but held open; on the machine's (the rlimits mode) a walk, stopped once past `stop`,
    and the files the tree's processes hold open after removing them."""
    folder = config["cwd"]
    if config.get("folder_own_fs"):
        fs = os.statvfs(folder)
        return (fs.f_blocks - fs.f_bfree) * fs.f_frsize + (fs.f_files - fs.f_ffree) * PAGE
    total, seen, todo = 0, set(), [folder]
    try:
        device = os.lstat(folder).st_dev
        while todo and total <= stop:
            with os.scandir(todo.pop()) as entries:
                for entry in entries:
                    info = entry.stat(follow_symlinks=False)
                    seen.add(info.st_ino)
                    total += info.st_blocks * 512 + PAGE
                    if entry.is_dir(follow_symlinks=False):
                        todo.append(entry.path)
    except PermissionError:
        return None
    except OSError:
        pass  # removed while walked
    for pid in live:
        try:
            fds = os.listdir("/proc/%d/fd" % pid)
        except OSError:
            continue
        for fd in fds:
            try:
                info = os.stat("/proc/%d/fd/%s" % (pid, fd))
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode) and info.st_nlink == 0 and info.st_dev == device \
                    and info.st_ino not in seen:
                seen.add(info.st_ino)
                total += info.st_blocks * 512
    return total


# --------------------------------------------------------------------------- the process tree

CLOCK = os.sysconf("SC_CLK_TCK")


HAS_CHILDREN_FILE = os.path.exists("/proc/self/task/%d/children" % os.getpid())


def children(pid):
    if not HAS_CHILDREN_FILE:  # a kernel without CONFIG_PROC_CHILDREN: read every process's parent
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open("/proc/%s/stat" % entry) as handle:
                        if int(handle.read().rsplit(")", 1)[1].split()[1]) == pid:
                            found.append(int(entry))
                except (OSError, IndexError, ValueError):
                    pass
        return found
    found = []
    try:
        for task in os.listdir("/proc/%d/task" % pid):
            with open("/proc/%d/task/%s/children" % (pid, task)) as handle:
                found += [int(p) for p in handle.read().split()]
    except OSError:
        pass
    return found


def descendants(root):
    found, todo = [], [root]
    while todo:
        for child in children(todo.pop()):
            found.append(child)
            todo.append(child)
    return found


def resident_of(pid):
    """Resident bytes of a live process (pages shared with its parent after a fork count in both:
    an upper bound)."""
    try:
        with open("/proc/%d/statm" % pid) as handle:
            return int(handle.read().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def cpu_of(pid):
    """User + system CPU seconds of a live process and of the children it has waited for."""
    try:
        with open("/proc/%d/stat" % pid) as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        return sum(int(f) for f in fields[11:15]) / CLOCK
    except (OSError, IndexError, ValueError):
        return 0.0


class Tree:
    def __init__(self, program):
        self.program, self.status, self.reaped_cpu = program, None, 0.0

    def reap(self):
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.reaped_cpu += usage.ru_utime + usage.ru_stime
            if pid == self.program:
                self.status = status

    def measure(self):
        """CPU seconds (finished processes included) and resident bytes of the whole tree now, and
        its live processes."""
        live = descendants(os.getpid())
        return self.reaped_cpu + sum(cpu_of(pid) for pid in live), sum(resident_of(pid) for pid in live), live

    def kill(self):
        """SIGKILL every process of the tree until none is left; how many there were, the
        program itself not counted."""
        left = None
        for _ in range(1000):
            live = descendants(os.getpid())
            if left is None:
                left = len([pid for pid in live if pid != self.program])
            if not live:
                break
            for pid in live:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.002)
            self.reap()
        self.reap()
        return left or 0


def end_with_parent(*_):
    """The evaluator ended (the rlimits mode's death signal): kill the whole tree, then go."""
    Tree(None).kill()
    os._exit(1)


# --------------------------------------------------------------------------- main

def child(config, setup):
    """In the forked child: every layer, then exec the program. Never returns."""
    try:
        os.setpgid(0, 0)
        for name, value in config["rlimits"].items():
            resource.setrlimit(getattr(resource, name), (value, value))
        if config.get("uid") is not None:
            os.setgroups([])
            os.setresgid(config["gid"], config["gid"], config["gid"])
            if config.get("read_search"):
                prctl(PR_SET_KEEPCAPS, 1)
            os.setresuid(config["uid"], config["uid"], config["uid"])
            if config.get("read_search"):
                keep_only_read_search()
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        prctl(PR_SET_NO_NEW_PRIVS, 1)
        if config["landlock_abi"]:
            landlock(config["landlock_abi"], config["read"], config["write"], config["files"])
        if config["seccomp"]:
            load_seccomp(seccomp_program(os.getpid(), config["refuse_ipc"]))
        os.chdir(config["cwd"])
        os.execve(config["argv"][0], config["argv"], config["env"])
    except BaseException as err:
        os.write(setup, ("%s: %s" % (type(err).__name__, err)).encode("utf-8", "replace")[:1000])
    os._exit(127)


def main():
    with open(sys.argv[1]) as handle:
        config = json.load(handle)
    verdict = int(sys.argv[2])
    os.set_inheritable(verdict, False)
    started = time.monotonic()
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    if config.get("die_with_parent"):
        # Not SIGKILL: the program's children do not die with it (a death signal is not
        # inherited), and a `setsid` grandchild would outlive a killed evaluator, holding the run's
        # IPC namespace and what it made there. The tree goes first, then the supervisor.
        signal.signal(signal.SIGTERM, end_with_parent)
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != config["parent"]:  # the evaluator died before the line above
            end_with_parent()
    layers = {"uid": config.get("uid"), "nproc": config["rlimits"].get("RLIMIT_NPROC"),
              "tree_memory_mb": config["tree_memory"] >> 20}
    abi = landlock_abi() if config.get("landlock") else 0
    config["landlock_abi"] = abi
    layers["landlock"] = abi
    config["seccomp"] = bool(config.get("seccomp")) and platform.machine() in SYSCALLS
    layers["seccomp"] = config["seccomp"]
    own_ipc = own_ipc_namespace(config["evaluator_ipc"], config.get("ipc_namespace"))
    config["refuse_ipc"] = not own_ipc
    layers["ipc"] = "namespace" if own_ipc else "refused" if config["seccomp"] else "shared"
    layers["folder_mb"] = config["folder_bytes"] >> 20
    given = folder_usage(config, [], float("inf")) or 0  # the files it was given: the bound is on what it adds
    setup_read, setup_write = os.pipe()  # close-on-exec: it closes, empty, when the exec succeeds
    pid = os.fork()
    if pid == 0:
        os.close(setup_read)
        child(config, setup_write)
    os.close(setup_write)
    problem = b""
    while True:
        chunk = os.read(setup_read, 1000)
        if not chunk:
            break
        problem += chunk
    os.close(setup_read)
    tree, reason, peak, peak_folder = Tree(pid), None, 0, 0
    while True:
        tree.reap()
        if tree.status is not None:
            break
        cpu, held, live = tree.measure()
        held += sysv_bytes() if own_ipc else 0
        peak = max(peak, held)
        grown = folder_usage(config, live, given + config["folder_bytes"])
        peak_folder = None if grown is None or peak_folder is None else max(peak_folder, grown - given)
        # Memory and the folder first: past one of those, a run starved of ticks on a loaded
        # machine may be past its CPU time too, and the note should name what it filled.
        if held > config["tree_memory"]:
            reason = "memory"
            break
        if peak_folder is None or peak_folder > config["folder_bytes"]:
            reason = "disk"
            break
        if cpu > config["cpu_seconds"]:
            reason = "cpu"
            break
        if time.monotonic() - started > config["wall_seconds"]:
            reason = "wall"
            break
        time.sleep(0.02)
    if reason is None:  # what the folder and the namespace hold outlives the program until the run ends: a last look
        held = sysv_bytes() if own_ipc else 0
        peak = max(peak, held)
        grown = folder_usage(config, [], given + config["folder_bytes"])
        peak_folder = None if grown is None or peak_folder is None else max(peak_folder, grown - given)
        reason = ("memory" if held > config["tree_memory"] else
                  "disk" if peak_folder is None or peak_folder > config["folder_bytes"] else None)
    cpu = tree.measure()[0]
    left = tree.kill()
    cpu = max(cpu, tree.reaped_cpu)
    status = tree.status
    out = {"reason": reason, "cpu_seconds": round(cpu, 3), "wall_seconds": round(time.monotonic() - started, 3),
           "left": left, "layers": layers, "peak_memory_mb": peak >> 20,
           "peak_folder_mb": None if peak_folder is None else peak_folder >> 20,
           "setup_error": problem.decode("utf-8", "replace") or None,
           "exit_code": os.WEXITSTATUS(status) if status is not None and os.WIFEXITED(status) else None,
           "signal": os.WTERMSIG(status) if status is not None and os.WIFSIGNALED(status) else None}
    os.write(verdict, json.dumps(out).encode())
    os.close(verdict)


if __name__ == "__main__":
    main()
