"""What the host offers the sandbox, probed once per process: bubblewrap, the interpreter's files
(the allow-list), writable cgroup v1 controllers, a core-dump pattern that keeps cores inside; and
the seccomp filter bwrap loads. Used by the parent side (``__init__.py``), never by the supervisor.
"""
from __future__ import annotations

import os
import struct
import sys

from .supervisor import rmdir_cgroup

_HOST: dict = {}        # bwrap path, read-only binds, seccomp program, cgroup dirs: probed once


def host_probe() -> dict:
    if not _HOST:
        import shutil
        import subprocess

        _HOST.update(bwrap=shutil.which("bwrap") or "", binds=_interpreter_files(subprocess),
                     seccomp=seccomp_filter().hex(), cgroups=_cgroup_parents())
    return _HOST


def _interpreter_files(subprocess) -> list[str]:
    """The interpreter, its standard library and the shared libraries both load (the allow-list)."""
    exe = os.path.realpath(sys.executable)
    stdlib = os.path.dirname(os.path.realpath(os.__file__))
    dynload = os.path.join(stdlib, "lib-dynload")
    modules = [os.path.join(dynload, f) for f in sorted(os.listdir(dynload))] if os.path.isdir(dynload) else []
    out = subprocess.run(["ldd", exe, *modules], capture_output=True, text=True, env={"LC_ALL": "C"}).stdout
    libs = set()
    for line in out.splitlines():
        path = line.split("=>")[-1].strip().split(" (")[0].strip()
        if path.startswith("/") and os.path.exists(path):
            libs.add(path)
    inside = lambda p: p.startswith(stdlib + "/")  # noqa: E731 - already bound with the library
    return [exe, stdlib, *sorted(p for p in libs if not inside(p)),
            *(["/etc/ld.so.cache"] if os.path.exists("/etc/ld.so.cache") else [])]


def _cgroup_parents() -> dict:
    """{controller: the dir under which per-test cgroups go} for the v1 memory and pids controllers
    this process may write to; empty when the machine offers none (then limits are per process)."""
    found = {}
    try:
        lines = open("/proc/self/cgroup").read().splitlines()
    except OSError:
        return found
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for name in ("memory", "pids"):
            if name in controllers.split(","):
                base = f"/sys/fs/cgroup/{name}"
                mine = base + path if os.path.isdir(base + path) else base
                if os.path.exists(f"{mine}/cgroup.procs") and os.access(mine, os.W_OK):
                    found[name] = mine
    return found


def cgroup_note() -> str | None:
    """What is per process only on this machine because a cgroup controller is missing (None: none)."""
    missing = [c for c in ("memory", "pids") if c not in host_probe()["cgroups"]]
    if not missing:
        return None
    what = {"memory": "memory is capped per process (RLIMIT_AS), not per test",
            "pids": "processes are capped by RLIMIT_NPROC, counted per user, not per test"}
    return ("no writable cgroup v1 " + " / ".join(missing) + " controller: " + "; ".join(what[c] for c in missing))


CORE_PATTERN = "/proc/sys/kernel/core_pattern"
ALLOW_CORE_SOCKET = "RAGEN2_SANDBOX_ALLOW_CORE_SOCKET"


def read_core_pattern() -> str:
    try:
        with open(CORE_PATTERN) as f:
            return f.read().strip()
    except OSError:
        return ""


def core_pattern_problem(pattern: str | None = None) -> str | None:
    """Why a crash in the sandbox could hand the program's memory to a core-dump handler outside it
    (None when it cannot). ``pattern`` defaults to the host's kernel.core_pattern.

    A file pattern gets no core (RLIMIT_CORE is 1 byte, under the smallest core) and a pipe ('|')
    pattern none either (the kernel refuses a pipe helper at RLIMIT_CORE 1). A socket ('@', Linux
    6.16+) handler ignores RLIMIT_CORE: only non-dumpability stops it, and a program that executes a
    new binary is dumpable again."""
    pattern = read_core_pattern() if pattern is None else pattern
    if not pattern.startswith("@") or os.environ.get(ALLOW_CORE_SOCKET) == "1":
        return None
    return (f"kernel.core_pattern is {pattern!r}, a core-dump socket: the kernel would hand the core of a "
            "crashing program to that handler outside the sandbox, whatever RLIMIT_CORE says. Set a file or "
            "pipe pattern (e.g. sysctl -w kernel.core_pattern=core), or accept this with "
            f"{ALLOW_CORE_SOCKET}=1.")


def remove_cgroups(prefix: str) -> None:
    for parent in host_probe()["cgroups"].values():
        for name in os.listdir(parent):
            if name.startswith(prefix):
                rmdir_cgroup(os.path.join(parent, name))


# ---------------------------------------------------------------------------- the seccomp filter

_AUDIT_ARCH_X86_64, _X32_BIT = 0xC000003E, 0x40000000
_RET_KILL, _RET_ALLOW, _RET_ERRNO = 0x80000000, 0x7FFF0000, 0x00050000
_EPERM, _ENOSYS, _EAFNOSUPPORT = 1, 38, 97
_NS_FLAGS = 0x7E020000   # CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
_DENIED = {  # x86-64 syscall numbers (asm/unistd_64.h) -> EPERM
    "ptrace": 101, "syslog": 103, "uselib": 134, "personality": 135, "pivot_root": 155, "chroot": 161,
    "acct": 163, "mount": 165, "umount2": 166, "swapon": 167, "swapoff": 168, "reboot": 169,
    "sethostname": 170, "setdomainname": 171, "init_module": 175, "delete_module": 176, "quotactl": 179,
    "lookup_dcookie": 212, "kexec_load": 246, "add_key": 248, "request_key": 249, "keyctl": 250,
    "unshare": 272, "perf_event_open": 298, "name_to_handle_at": 303, "open_by_handle_at": 304,
    "setns": 308, "process_vm_readv": 310, "process_vm_writev": 311, "finit_module": 313,
    "kexec_file_load": 320, "bpf": 321, "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426,
    "io_uring_register": 427, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
    "fsmount": 432, "fspick": 433, "mount_setattr": 442, "pidfd_getfd": 438,
}
_CLONE, _CLONE3, _SOCKET = 56, 435, 41
_PRCTL, _SETRLIMIT, _PRLIMIT64 = 157, 160, 302
_PR_SET_DUMPABLE, _RLIMIT_CORE = 4, 4
_SOCKET_FAMILIES = (1, 2, 10)  # AF_UNIX, AF_INET, AF_INET6


def seccomp_filter() -> bytes:
    """The classic-BPF seccomp program bwrap loads (``struct sock_filter`` array, native order).
    seccomp_data: nr at offset 0, arch at 4, args[i] at 16 + 8 i (low 32 bits first)."""
    ld = lambda off: (0x20, 0, 0, off)                  # noqa: E731 - BPF_LD | BPF_W | BPF_ABS
    jeq = lambda k, jt, jf: (0x15, jt, jf, k)           # noqa: E731 - BPF_JMP | BPF_JEQ | BPF_K
    jge = lambda k, jt, jf: (0x35, jt, jf, k)           # noqa: E731
    jset = lambda k, jt, jf: (0x45, jt, jf, k)          # noqa: E731
    ret = lambda k: (0x06, 0, 0, k)                     # noqa: E731 - BPF_RET | BPF_K
    errno = lambda e: ret(_RET_ERRNO | e)               # noqa: E731
    prog = [ld(4), jeq(_AUDIT_ARCH_X86_64, 1, 0), ret(_RET_KILL),
            ld(0), jge(_X32_BIT, 0, 1), ret(_RET_KILL)]
    for nr in sorted(_DENIED.values()):
        prog += [jeq(nr, 0, 1), errno(_EPERM)]
    prog += [jeq(_CLONE3, 0, 1), errno(_ENOSYS)]
    prog += [jeq(_CLONE, 0, 4), ld(16), jset(_NS_FLAGS, 0, 1), errno(_EPERM), ret(_RET_ALLOW)]
    # The runner makes itself non-dumpable and the supervisor sets RLIMIT_CORE to 1 (the value at which
    # the kernel refuses to pipe a core to a core_pattern helper); the program may undo neither.
    prog += [jeq(_PRCTL, 0, 6), ld(16), jeq(_PR_SET_DUMPABLE, 0, 3), ld(24), jeq(0, 1, 0), errno(_EPERM),
             ret(_RET_ALLOW)]
    prog += [jeq(_SETRLIMIT, 0, 4), ld(16), jeq(_RLIMIT_CORE, 0, 1), errno(_EPERM), ret(_RET_ALLOW)]
    # prlimit64(pid, RLIMIT_CORE, new, old) with a new limit (a non-null pointer: both halves checked)
    prog += [jeq(_PRLIMIT64, 0, 8), ld(24), jeq(_RLIMIT_CORE, 0, 5), ld(32), jeq(0, 0, 2), ld(36),
             jeq(0, 1, 0), errno(_EPERM), ret(_RET_ALLOW)]
    n = len(_SOCKET_FAMILIES)
    prog += [jeq(_SOCKET, 0, n + 2), ld(16)]
    prog += [jeq(fam, n - i, 0) for i, fam in enumerate(_SOCKET_FAMILIES)]
    prog += [errno(_EAFNOSUPPORT), ret(_RET_ALLOW)]
    return b"".join(struct.pack("=HBBI", *ins) for ins in prog)

