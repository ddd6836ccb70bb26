"""Run model-written Python against tests: one fresh bubblewrap sandbox per test, isolated, reported.

    from ragen2_core.envs.sandbox import Limits, Test, run_tests
    results = run_tests("def solve(x):\n    return x + 1",
                        [Test(call="solve", args=[1], expected=2), Test(call="solve", args=[5], expected=7)],
                        Limits(wall_s=2.0))
    [r.status for r in results]        # ['pass', 'wrong_answer']
    run_tests("print(int(input()) * 2)", [Test(stdin="21\n", expected_stdout="42")])  # stdin/stdout test

    python -I -S ragen2_core/envs/sandbox.py < job.json     # the supervisor (internal; root only)

The isolation is bubblewrap's (``bwrap``, the sandbox Flatpak is built on), not ours: we only choose
its arguments. Needs Linux x86-64, root (to make cgroups and drop to an unprivileged uid) and the
``bubblewrap`` package; ``isolation_problem`` says what is missing and how to fix it.

* The parent starts a supervisor interpreter (``python -I -S`` this file, empty environment, own
  process group) that runs the tests one after another. Per test it makes a memory and a pids
  cgroup (v1 controllers, under its own cgroup), forks a child that joins them, joins a fresh
  session keyring, sets RLIMIT_CORE to 1, drops to uid/gid 65534 with no groups and executes
  ``bwrap``.
* bwrap builds new user, mount, PID, IPC, network, UTS and cgroup namespaces (no further user
  namespaces) whose root is an empty tmpfs holding only, read-only: the interpreter, its standard
  library (site-packages covered by an empty tmpfs) and the shared libraries they load (found with
  ``ldd``). /tmp (the working directory, ``disk_mb``) and /dev/shm are private size-capped tmpfs,
  /proc is the namespace's own, /dev a minimal one. Nothing of the project, its data or the host's
  sockets exists inside.
* A seccomp filter (classic BPF built below, loaded by bwrap) denies new namespaces (unshare,
  setns, clone with namespace flags; clone3 answers ENOSYS so libc falls back to clone), mount
  and the new mount API, keyctl/add_key/request_key, ptrace and process_vm_*, bpf,
  perf_event_open, userfaultfd, io_uring, module and kexec calls, and sockets other than
  AF_UNIX/AF_INET/AF_INET6 (so no AF_VSOCK, AF_ALG, AF_NETLINK), pidfd_getfd, making a process
  dumpable again and changing RLIMIT_CORE; other architectures' and x32 calls kill the process.
* Inside, a small runner (``_RUNNER``, trusted, runs first) is the namespace's pid 1 (``bwrap
  --as-pid-1``, so no unfiltered bwrap init is there to reach). It sets per-process rlimits (CPU
  seconds, address space, open files, file size = output cap), makes itself non-dumpable (its
  /proc/1/mem and /proc/1/exe are closed to the program; no core of it or of the program reaches a
  core-dump handler) and runs the program in a child, whose exit status it passes on; a call
  test's return value comes back through a size-capped, depth-checked JSON channel.
* The supervisor enforces each test's wall clock, kills the cgroup's processes when it ends and
  removes the cgroups. The memory cgroup caps all of a test's processes together (tmpfs and SysV
  shared memory included); the pids cgroup counts only that test's processes.

Without writable cgroup v1 memory/pids controllers the sandbox still runs, but the memory cap is
per process (RLIMIT_AS) and the process cap is RLIMIT_NPROC, counted per user; ``cgroup_note``
says so. A ``kernel.core_pattern`` that names a socket ('@') is refused (``core_pattern_problem``).
The expected outputs never enter the sandbox: stdout or the return value comes back and is compared
here: integers, bools and strings exactly, floats within 1e-6 only where the expected value is a float.
"""
from __future__ import annotations

import ctypes
import json
import os
import re
import resource
import select
import signal
import struct
import sys
import time

# One status per test. Everything except "pass" is a failure kind counted in metrics.
STATUSES = ("pass", "wrong_answer", "timeout", "memory", "crash", "output_limit", "syntax_error",
            "sandbox_error")
INSTALL_HINT = "install bubblewrap (Debian/Ubuntu: apt-get install -y bubblewrap; scripts/setup.sh does it)"
_ERR_TAIL = 2000            # bytes of stderr kept for the failure detail
_MAX_DEPTH = 64             # nesting a returned value may have
_SANDBOX_ID = 65534         # the unprivileged uid/gid outside and inside


# ============================================================================ parent side

class SandboxUnavailable(RuntimeError):
    """This machine cannot isolate programs as required; the message says why and what to do."""


class Limits:
    """Per-test resource limits; memory and processes are per test (all its processes together)."""

    def __init__(self, *, wall_s: float = 2.0, cpu_s: int = 1, memory_mb: int = 256, max_procs: int = 8,
                 max_files: int = 32, output_bytes: int = 65536, disk_mb: int = 16):
        if wall_s <= 0 or cpu_s < 1 or memory_mb < 32 or max_procs < 1 or max_files < 8:
            raise ValueError(f"limits too small: wall_s={wall_s} (> 0), cpu_s={cpu_s} (>= 1), "
                             f"memory_mb={memory_mb} (>= 32), max_procs={max_procs} (>= 1), "
                             f"max_files={max_files} (>= 8)")
        self.wall_s, self.cpu_s, self.memory_mb, self.max_procs = wall_s, cpu_s, memory_mb, max_procs
        self.max_files, self.output_bytes, self.disk_mb = max_files, output_bytes, disk_mb

    def job(self) -> dict:
        return dict(cpu_s=self.cpu_s, memory=self.memory_mb << 20, max_procs=self.max_procs,
                    max_files=self.max_files, output_bytes=self.output_bytes, disk_mb=self.disk_mb,
                    wall_s=self.wall_s)


class Test:
    """One test: a stdin/stdout test (``stdin``, ``expected_stdout``) or a call test (``call`` names
    the function, or a method of class ``Solution``; ``args`` are JSON values; ``expected`` the
    JSON-comparable return value)."""

    __test__ = False  # not a pytest class, despite the name

    def __init__(self, *, stdin: str = "", expected_stdout: str | None = None, call: str | None = None,
                 args: list | tuple = (), expected=None):
        if (call is None) == (expected_stdout is None):
            raise ValueError("a Test needs exactly one of expected_stdout (stdin/stdout test) or call "
                             "(function test)")
        self.stdin, self.expected_stdout, self.call = stdin, expected_stdout, call
        self.args, self.expected = list(args), expected

    # A plain class, not a dataclass: the supervisor runs this file, and its start-up is paid per reply.
    def __eq__(self, other) -> bool:
        return isinstance(other, Test) and vars(self) == vars(other)

    def __repr__(self) -> str:
        return "Test(" + ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if v not in (None, "", [])) + ")"


class TestResult:
    """``status`` is one of STATUSES; ``detail`` says why (exception, signal, ...)."""

    __test__ = False

    def __init__(self, status: str, detail: str = "", stdout: str = "", wall_s: float = 0.0):
        self.status, self.detail, self.stdout, self.wall_s = status, detail, stdout, wall_s

    def __repr__(self) -> str:
        return f"TestResult({self.status!r}, {self.detail!r})"


def run_tests(program: str, tests: list[Test], limits: Limits | None = None) -> list[TestResult]:
    """Run ``program`` once per test, each in its own sandbox with its own timeout."""
    import subprocess

    limits = limits or Limits()
    if not tests:
        return []
    problem = isolation_problem()
    if problem:
        raise SandboxUnavailable(problem)
    return _supervised(subprocess, program, tests, limits)


def _supervised(subprocess, program: str, tests: list[Test], limits: Limits) -> list[TestResult]:
    cases = [{"stdin": t.stdin, "call": t.call, "args": t.args} for t in tests]
    job = json.dumps({"program": program, "cases": cases, **limits.job(), **_host()})
    deadline = len(tests) * (limits.wall_s + _SETUP_S) + 10.0  # a backstop: the supervisor enforces each test
    proc = subprocess.Popen([sys.executable, "-I", "-S", "-B", os.path.abspath(__file__)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={}, cwd="/", start_new_session=True)
    try:
        out, err = proc.communicate(job.encode(), timeout=deadline)
    except subprocess.TimeoutExpired:
        # Not reaped yet, so the group id is still ours; each bwrap dies with it (parent-death signal).
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        _remove_cgroups(f"ragen2-sbx-{proc.pid}-")
        return [TestResult("sandbox_error", f"supervisor exceeded {deadline:.0f}s")] * len(tests)
    try:
        raw = json.loads(out)
    except ValueError:
        why = err.decode(errors="replace").strip()[-_ERR_TAIL:] or f"exit code {proc.returncode}"
        return [TestResult("sandbox_error", why)] * len(tests)
    if isinstance(raw, dict):  # the supervisor could not set up isolation
        return [TestResult("sandbox_error", raw["error"])] * len(tests)
    return [_judge(r, t, limits) for r, t in zip(raw, tests)]


def _judge(r: dict, test: Test, limits: Limits) -> TestResult:
    exit_code, err = r["exit"], r["stderr"]
    # bwrap reports a program killed by signal N as exit status 128 + N.
    sig = exit_code - 128 if exit_code is not None and exit_code > 128 else None
    res = lambda status, detail="": TestResult(status, detail, r["stdout"], r["wall_s"])  # noqa: E731
    if r["timed_out"]:
        return res("timeout", f"wall clock over {limits.wall_s:g}s")
    if not r["started"]:
        return res("sandbox_error", f"sandbox setup failed (exit {exit_code}): {err[-300:].strip()}")
    if r["oom_kills"]:
        return res("memory", f"memory over {limits.memory_mb} MiB (all processes of the test together)")
    if sig == signal.SIGXCPU:
        return res("timeout", f"CPU time over {limits.cpu_s}s")
    if sig == signal.SIGXFSZ or r["stdout_bytes"] >= limits.output_bytes or r["report_bytes"] >= limits.output_bytes:
        return res("output_limit", f"output over {limits.output_bytes} bytes")
    report = _parse_report(r["report"])
    if report is None:
        if "MemoryError" in err:
            return res("memory", "MemoryError")
        why = f"killed by {_signal_name(sig)}" if sig else f"exit code {exit_code}"
        if r["report"] and exit_code == 0:
            why = "the result channel held no readable report"
        return res("crash", f"{why}: {err[-200:].strip()}" if err.strip() else why)
    error = report.get("error")
    if error == "MemoryError":
        return res("memory", "MemoryError")
    if error in ("SyntaxError", "IndentationError", "TabError"):
        return res("syntax_error", f"{error}: {report.get('msg', '')}")
    if error == "BadReturn":
        return res("wrong_answer", f"return value is not a JSON value: {report.get('msg', '')}")
    if error:
        return res("crash", f"{error}: {report.get('msg', '')}")
    if test.call is not None:
        value = report.get("value")
        ok = values_match(value, test.expected)
        return res("pass" if ok else "wrong_answer", "" if ok else f"returned {_short(value)}")
    ok = stdout_matches(r["stdout"], test.expected_stdout)
    return res("pass" if ok else "wrong_answer", "" if ok else "stdout differs")


def _parse_report(text: str) -> dict | None:
    """The runner's report, or None when the channel is empty, garbled, a JSON bomb or too deep: the
    program shares the process with the runner, so it can write anything there."""
    if not text:
        return None
    try:
        report = json.loads(text)
    except (ValueError, RecursionError):  # also ints over Python's digit limit
        return None
    return report if isinstance(report, dict) and _depth(report) <= _MAX_DEPTH + 2 else None


def _depth(value) -> int:
    depth, level = 0, [value]
    while level:
        depth += 1
        level = [v for x in level if isinstance(x, (list, dict))
                 for v in (x.values() if isinstance(x, dict) else x)]
    return depth


def _short(value) -> str:
    try:
        return f"{value!r:.80}"
    except (ValueError, RecursionError):
        return "(unprintable)"


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def stdout_matches(got: str, expected: str) -> bool:
    """Whitespace-insensitive token match. An integer token must be the same integer; only a token the
    task writes as a float (``2.50``, ``1e-3``) accepts a number within 1e-6 (relative or absolute)."""
    a, b = got.split(), expected.split()
    return len(a) == len(b) and all(x == y or _token_match(x, y) for x, y in zip(a, b))


def values_match(got, expected) -> bool:
    """Equality of JSON values (tuples are lists). Integers, bools and strings compare exactly; the
    1e-6 tolerance is only for an expected float, which is how a task declares a float answer. Never
    raises: an int too large for a float, or a non-finite value, is simply unequal."""
    if isinstance(expected, bool) or isinstance(got, bool):
        return got is expected
    if isinstance(expected, (int, float)) and isinstance(got, (int, float)):
        if isinstance(expected, int):
            return got == expected  # Python compares int and float exactly: 10**12 + 0.4 != 10**12
        return _near(got, expected)
    if isinstance(expected, (list, tuple)) and isinstance(got, (list, tuple)):
        return len(got) == len(expected) and all(values_match(g, e) for g, e in zip(got, expected))
    if isinstance(expected, dict) and isinstance(got, dict):
        return got.keys() == expected.keys() and all(values_match(got[k], expected[k]) for k in expected)
    return got == expected


_INT_TOKEN = re.compile(r"[+-]?\d+")


def _token_match(x: str, y: str) -> bool:
    """``x`` (printed) against ``y`` (expected), both single tokens that differ as text."""
    if _INT_TOKEN.fullmatch(y):
        # A tolerance here would pay for 1000000000008 against 1000000000007, a reward to exploit.
        return _INT_TOKEN.fullmatch(x) is not None and _int_text(x) == _int_text(y)
    try:
        return _near(float(x), float(y))
    except ValueError:
        return False


def _int_text(token: str) -> str:
    """The integer's canonical digits (``+07`` -> ``7``, ``-0`` -> ``0``), compared as text: ``int()``
    refuses over 4300 digits, and a printed token may be longer."""
    digits = token.lstrip("+-").lstrip("0") or "0"
    return "-" + digits if token.startswith("-") and digits != "0" else digits


def _near(got: float, expected: float) -> bool:
    try:
        g, e = float(got), float(expected)
    except OverflowError:
        return False
    return g == e or abs(g - e) <= 1e-6 * max(1.0, abs(e))


# ---------------------------------------------------------------------------- what the host offers

_HOST: dict = {}        # bwrap path, read-only binds, seccomp program, cgroup dirs: probed once
_PROBLEM: list[str | None] = []


def _host() -> dict:
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
    missing = [c for c in ("memory", "pids") if c not in _host()["cgroups"]]
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


def _remove_cgroups(prefix: str) -> None:
    for parent in _host()["cgroups"].values():
        for name in os.listdir(parent):
            if name.startswith(prefix):
                _rmdir_cgroup(os.path.join(parent, name))


def isolation_problem() -> str | None:
    """Why this machine cannot sandbox programs (None when it can). Probed once per process."""
    if _PROBLEM:
        return _PROBLEM[0]
    import platform

    core = core_pattern_problem()
    if not sys.platform.startswith("linux") or platform.machine() != "x86_64":
        problem = (f"the sandbox needs Linux on x86-64 (its seccomp filter is written for it); this is "
                   f"{sys.platform} on {platform.machine()}. Run code envs there, or use a math/grid env.")
    elif os.geteuid() != 0:
        problem = ("the sandbox needs root to make per-test cgroups and drop to an unprivileged uid; this "
                   f"process runs as uid {os.geteuid()}. Run training as root (e.g. in the project's "
                   "container) or use a math/grid env.")
    elif not _host()["bwrap"]:
        problem = f"the sandbox runs programs with bubblewrap, which is not installed: {INSTALL_HINT}."
    elif core:
        problem = core
    else:
        _PROBLEM.append(None)  # let the probe itself run
        try:
            [r] = run_tests("print(1)", [Test(expected_stdout="1")], Limits(wall_s=10.0))
            problem = None if r.status == "pass" else (
                f"the sandbox self-test failed ({r.status}: {r.detail}). bubblewrap needs user namespaces "
                "(sysctl user.max_user_namespaces > 0; in a container, run it with --privileged or "
                "--security-opt seccomp=unconfined), or use a math/grid env.")
        finally:
            _PROBLEM.clear()
    _PROBLEM.append(problem)
    return problem


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


# ============================================================================ supervisor side
# Everything below runs in the supervisor interpreter started by run_tests (stdlib only, root).

# Runs inside the sandbox as ``python -I -S -B -c _RUNNER``: fd 0-2 stdio, 3 the result channel,
# 4 the started marker (closed before the program runs, so the program cannot fake a setup
# failure), 5 the job. Limits are set before any program code runs.
_RUNNER = r'''
import builtins, ctypes, json, os, resource, signal, sys
with open(5, "rb") as f:
    job = json.load(f)
n = job["output_bytes"]
limits = [(resource.RLIMIT_CPU, (job["cpu_s"], job["cpu_s"] + 1)), (resource.RLIMIT_AS, (job["memory"],) * 2),
          (resource.RLIMIT_NOFILE, (job["max_files"],) * 2), (resource.RLIMIT_FSIZE, (n, n))]
if job["nproc"]:
    limits.append((resource.RLIMIT_NPROC, (job["nproc"],) * 2))
for what, value in limits:
    resource.setrlimit(what, value)
# Non-dumpable (the program inherits it, and seccomp keeps it so): no core reaches a core_pattern
# handler, and the program, of the same uid, cannot open this pid 1's /proc/1/mem or /proc/1/exe.
libc = ctypes.CDLL(None)
if libc.prctl(4, 0, 0, 0, 0) != 0 or libc.prctl(3, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE, PR_GET_DUMPABLE
    os._exit(125)  # without the marker: reported as a set-up failure
os.write(4, b"started")
os.close(4)
os.closerange(5, 1 << 16)
# This process is the sandbox's pid 1 (bwrap --as-pid-1): the program runs as its child, so every
# process in the sandbox is under the seccomp filter and the rlimits.
signal.signal(signal.SIGINT, signal.SIG_DFL)  # pid 1 ignores the signals it has no handler for
child = os.fork()
if child:
    code = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
    os._exit(128 - code if code < 0 else code)  # killed by signal N: 128 + N, as bwrap reports it
signal.signal(signal.SIGINT, signal.default_int_handler)
me = os.getpid()
sys.argv = ["solution.py"]
sys.stdin = open(0, encoding="utf-8", errors="replace", closefd=False)
sys.stdout = open(1, "w", encoding="utf-8", closefd=False)
sys.stderr = open(2, "w", encoding="utf-8", closefd=False, buffering=1)
is_call = job["call"] is not None
namespace = {"__name__": "__solution__" if is_call else "__main__", "__builtins__": builtins}
report = {}
value = None
def plain(v, depth=0):
    # JSON-safe copy of a return value; raises ValueError for anything else (depth-capped).
    if depth > 64:
        raise ValueError("nested deeper than 64")
    if v is None or type(v) in (bool, str):
        return v
    if type(v) is int:
        return v if abs(v) < 10 ** 4000 else str(v)[:1] + "...(int too large)"
    if type(v) is float:
        return v if v == v and abs(v) != float("inf") else repr(v)
    if type(v) in (list, tuple):
        return [plain(x, depth + 1) for x in v]
    if type(v) is dict and all(type(k) is str for k in v):
        return {k: plain(x, depth + 1) for k, x in v.items()}
    raise ValueError("a " + type(v).__name__ + " value")
try:
    code = compile(job["program"], "<solution>", "exec")
    exec(code, namespace)
    if is_call:
        name = job["call"]
        if callable(namespace.get(name)):
            target = namespace[name]
        elif isinstance(namespace.get("Solution"), type):
            target = getattr(namespace["Solution"](), name)
        else:
            raise NameError("the program defines no function " + repr(name))
        value = target(*job["args"])
except SystemExit as e:
    if is_call or e.code not in (None, 0):
        report = {"error": "SystemExit", "msg": str(e.code)}
except BaseException as e:
    try:
        report = {"error": type(e).__name__, "msg": str(e)[:200]}
    except BaseException:
        report = {"error": "Exception", "msg": "(unprintable)"}
if os.getpid() != me:
    os._exit(0)  # a forked child of the program: only the test process reports
if is_call and not report:
    try:
        report = {"value": plain(value)}
    except BaseException as e:
        report = {"error": "BadReturn", "msg": str(e)[:200] if isinstance(e, ValueError) else type(e).__name__}
try:
    sys.stdout.flush()
except BaseException as e:
    report = report or {"error": "OSError", "msg": str(e)[:200]}
try:
    data = json.dumps(report).encode()
except BaseException:
    data = b'{"error": "BadReturn", "msg": "not encodable"}'
try:
    os.write(3, data)
except OSError:
    pass
os._exit(0)
'''

_KEYCTL, _KEYCTL_JOIN_SESSION_KEYRING = 250, 1
_CLONE_NEWNS, _MS_BIND, _MS_REC, _MS_PRIVATE, _MS_NOSUID, _MS_NODEV = 0x20000, 4096, 16384, 1 << 18, 2, 4
_STAGE = "/tmp/ragen2-allowed"
_SETUP_S = 20.0  # bwrap and the runner's start, before the program's wall clock runs
_PR_SET_PDEATHSIG = 1


def _stage(binds: list[str]) -> None:
    """Make the allow-listed files reachable for the unprivileged uid that runs bwrap: the interpreter
    may sit under a directory only root can enter (/root/.pyenv). In a private mount namespace of
    this supervisor only, each path is bind-mounted at the same place under a fresh tmpfs (_STAGE);
    bwrap then binds that tree's top directories (a few mounts instead of one per file) read-only."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]

    def check(rc: int, what: str) -> None:
        if rc != 0:
            raise OSError(ctypes.get_errno(), f"{what}: {os.strerror(ctypes.get_errno())}")

    check(libc.unshare(_CLONE_NEWNS), "unshare a mount namespace")
    check(libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None), "make mounts private")
    # On /tmp of this namespace only, so nothing is created on the host.
    check(libc.mount(b"tmpfs", b"/tmp", b"tmpfs", _MS_NOSUID | _MS_NODEV, b"size=64k,mode=755"), "mount tmpfs on /tmp")
    for path in binds:
        target = _STAGE + path
        os.makedirs(os.path.dirname(target), 0o755, exist_ok=True)
        if os.path.isdir(path):
            os.mkdir(target, 0o755)
        else:
            os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o644))
        check(libc.mount(path.encode(), target.encode(), None, _MS_BIND | _MS_REC, None), f"bind {path}")


def _supervise() -> None:
    job = json.loads(sys.stdin.buffer.read())
    try:
        _stage(job["binds"])
        data = json.dumps(_run_cases(job)).encode()
    except BaseException as e:  # noqa: BLE001 - report any setup failure instead of hanging the parent
        data = json.dumps({"error": f"sandbox setup failed: {type(e).__name__}: {e}"}).encode()
    view = memoryview(data)
    while view:
        view = view[os.write(1, view):]


def _bwrap_args(job: dict, stdlib: str) -> list[str]:
    args = [job["bwrap"], "--unshare-all", "--unshare-user", "--disable-userns", "--as-pid-1", "--die-with-parent",
            "--new-session", "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp",
            "--setenv", "LANG", "C.UTF-8", "--uid", str(_SANDBOX_ID), "--gid", str(_SANDBOX_ID),
            "--hostname", "sandbox"]
    for top in sorted({path.split("/")[1] for path in job["binds"]}):
        args += ["--ro-bind", f"{_STAGE}/{top}", f"/{top}"]
    if os.path.isdir(os.path.join(stdlib, "site-packages")):
        args += ["--tmpfs", os.path.join(stdlib, "site-packages")]
    args += ["--proc", "/proc", "--dev", "/dev",
             "--perms", "1777", "--size", str(job["disk_mb"] << 20), "--tmpfs", "/tmp",
             "--perms", "1777", "--size", str(1 << 20), "--tmpfs", "/dev/shm",
             "--remount-ro", "/", "--chdir", "/tmp", "--seccomp", "6", "--",
             job["binds"][0], "-I", "-S", "-B", "-c", _RUNNER]
    return args


def _make_cgroups(job: dict, name: str) -> list[str]:
    dirs = []
    for controller, parent in job["cgroups"].items():
        path = os.path.join(parent, name)
        os.mkdir(path)
        dirs.append(path)
        if controller == "memory":
            _write(path, "memory.limit_in_bytes", job["memory"])
            if os.path.exists(f"{path}/memory.memsw.limit_in_bytes"):
                _write(path, "memory.memsw.limit_in_bytes", job["memory"])
        else:  # the outer bwrap and the runner (the sandbox's pid 1) count too
            _write(path, "pids.max", job["max_procs"] + 2)
    return dirs


def _write(d: str, name: str, value) -> None:
    with open(os.path.join(d, name), "w") as f:
        f.write(str(value))


def _kill_all(d: str) -> bool:
    """SIGKILL every process in cgroup ``d``; True when it was already empty."""
    try:
        pids = [int(p) for p in open(f"{d}/cgroup.procs").read().split()]
    except OSError:
        return True
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return not pids


def _rmdir_cgroup(d: str) -> None:
    for _ in range(200):  # the kernel frees a killed process's cgroup entry a moment after it dies
        _kill_all(d)
        try:
            os.rmdir(d)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.005)


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, 0)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _run_cases(job: dict) -> list[dict]:
    """The tests one after another: run side by side they would share CPUs, and a wall-clock limit
    would then measure the neighbours."""
    results = []
    for i, case in enumerate(job["cases"]):
        r = _start_case(job, i, case)
        # The wall clock starts when the runner says it started (a busy machine makes bwrap slow to set
        # up, which is no fault of the program); setup itself gets _SETUP_S.
        mark = r["fds"][4]
        ready = select.select([r["pidfd"], mark], [], [], _SETUP_S)[0]
        started_at = time.monotonic() if mark in ready else None
        if r["pidfd"] not in ready and started_at is not None:
            ready = select.select([r["pidfd"]], [], [], job["wall_s"])[0]
        results.append(_finish_case(job, r, timed_out=r["pidfd"] not in ready))
    return results


def _start_case(job: dict, i: int, case: dict) -> dict:
    stdlib = job["binds"][1]
    name = f"ragen2-sbx-{os.getpid()}-{i}"
    cgroups = _make_cgroups(job, name)
    nproc = 0 if "pids" in job["cgroups"] else job["max_procs"] + 2
    inner = {k: job[k] for k in ("program", "cpu_s", "memory", "max_files", "output_bytes")}
    inner.update(call=case["call"], args=case["args"], nproc=nproc)
    mark_r, mark_w = os.pipe()
    fds = [_memfd("stdin", case["stdin"].encode()), *(os.memfd_create(n, 0) for n in ("out", "err", "res")),
           mark_w, _memfd("job", json.dumps(inner).encode()), _memfd("seccomp", bytes.fromhex(job["seccomp"]))]
    argv = _bwrap_args(job, stdlib)
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            _child(fds, cgroups, argv)
        finally:
            os._exit(127)
    os.close(mark_w)
    os.set_blocking(mark_r, False)
    fds[4] = mark_r  # readable once the runner wrote its marker, or at EOF when it never will
    return dict(pid=pid, pidfd=os.pidfd_open(pid), t0=t0, cgroups=cgroups, fds=fds)


def _finish_case(job: dict, r: dict, timed_out: bool) -> dict:
    pid, cgroups, fds = r["pid"], r["cgroups"], r["fds"]
    if timed_out:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    os.close(r["pidfd"])
    wall = time.monotonic() - r["t0"]
    oom = 0
    for d in cgroups:
        if d.startswith(job["cgroups"].get("memory", "\0")):
            for line in open(f"{d}/memory.oom_control").read().splitlines():
                if line.startswith("oom_kill "):
                    oom = int(line.split()[1])
        _rmdir_cgroup(d)  # kills whatever the test left behind (daemons, forks) first
    cap = job["output_bytes"]
    stdout, n_out = _read(fds[1], cap)
    report, n_rep = _read(fds[3], cap)
    stderr, _ = _read(fds[2], _ERR_TAIL, tail=True)
    try:
        started = os.read(fds[4], 16) == b"started"
    except BlockingIOError:  # a writer is still alive but never wrote
        started = False
    for fd in fds:
        os.close(fd)
    return dict(timed_out=timed_out, exit=os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else None,
                started=started, oom_kills=oom, stdout=stdout, stdout_bytes=n_out, report=report,
                report_bytes=n_rep, stderr=stderr, wall_s=round(wall, 4))


def _read(fd: int, cap: int, tail: bool = False) -> tuple[str, int]:
    size = os.fstat(fd).st_size
    os.lseek(fd, max(0, size - cap) if tail else 0, os.SEEK_SET)
    return os.read(fd, cap).decode(errors="replace"), size


def _child(fds: list[int], cgroups: list[str], argv: list[str]) -> None:
    """Joins the test's cgroups and a fresh session keyring, drops to nobody, executes bwrap."""
    for d in cgroups:
        _write(d, "cgroup.procs", 0)  # 0: this process
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(_KEYCTL, _KEYCTL_JOIN_SESSION_KEYRING, None) < 0:
        raise OSError(ctypes.get_errno(), "cannot join a fresh session keyring")
    for target, fd in enumerate(fds):  # park above any fd the supervisor holds, then place
        os.dup2(fd, 4000 + target)
    for target in range(len(fds)):
        os.dup2(4000 + target, target)
        os.set_inheritable(target, True)
    os.closerange(len(fds), 1 << 16)
    # 1, not 0: the kernel pipes no core to a core_pattern helper at 1, and writes no core file under a
    # page; at 0 a helper still gets one. seccomp keeps the program from changing it.
    resource.setrlimit(resource.RLIMIT_CORE, (1, 1))
    os.setgroups([])
    os.setgid(_SANDBOX_ID)
    os.setuid(_SANDBOX_ID)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # after setuid, which clears it
    if os.getppid() == 1:
        os._exit(127)  # the supervisor died before the signal was armed
    os.execve(argv[0], argv, {})


if __name__ == "__main__":
    _supervise()
