"""Run model-written Python against tests: one fresh bubblewrap sandbox per test, isolated, reported.

    from ragen2_core.envs.sandbox import Limits, Test, run_tests
    results = run_tests("def solve(x):\n    return x + 1",
                        [Test(call="solve", args=[1], expected=2), Test(call="solve", args=[5], expected=7)],
                        Limits(wall_s=2.0))
    [r.status for r in results]        # ['pass', 'wrong_answer']
    run_tests("print(int(input()) * 2)", [Test(stdin="21\n", expected_stdout="42")])  # stdin/stdout test

    python -I -S -B ragen2_core/envs/sandbox/supervisor.py < job.json   # the supervisor (internal; root only)

The isolation is bubblewrap's (``bwrap``, the sandbox Flatpak is built on), not ours: we only choose
its arguments. Needs Linux x86-64, root (to make cgroups and drop to an unprivileged uid) and the
``bubblewrap`` package; ``isolation_problem`` says what is missing and how to fix it.

* The parent starts a supervisor interpreter (``python -I -S`` on ``supervisor.py``, empty
  environment, own process group) that runs the tests one after another. Per test it makes a memory and a pids
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

The package's files follow that trust boundary: this file is the API and the judging of outputs,
``host.py`` the probe of the machine and the seccomp filter, ``supervisor.py`` the program that runs
as root beside the sandbox (standard library only; it imports nothing of the package).
"""
from __future__ import annotations

import json
import os
import re
import signal
import sys

from .host import (ALLOW_CORE_SOCKET, cgroup_note, core_pattern_problem, host_probe, read_core_pattern,
                   remove_cgroups)
from .supervisor import ERR_TAIL, SETUP_S

__all__ = ["STATUSES", "INSTALL_HINT", "SandboxUnavailable", "Limits", "Test", "TestResult", "run_tests",
           "isolation_problem", "cgroup_note", "core_pattern_problem", "read_core_pattern", "ALLOW_CORE_SOCKET",
           "stdout_matches", "values_match"]
SUPERVISOR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "supervisor.py")

# One status per test. Everything except "pass" is a failure kind counted in metrics.
STATUSES = ("pass", "wrong_answer", "timeout", "memory", "crash", "output_limit", "syntax_error",
            "sandbox_error")
INSTALL_HINT = "install bubblewrap (Debian/Ubuntu: apt-get install -y bubblewrap; scripts/setup.sh does it)"
_MAX_DEPTH = 64             # nesting a returned value may have


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


_PROBLEM: list[str | None] = []  # the answer of isolation_problem, once per process


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
    elif not host_probe()["bwrap"]:
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
    job = json.dumps({"program": program, "cases": cases, **limits.job(), **host_probe()})
    deadline = len(tests) * (limits.wall_s + SETUP_S) + 10.0  # a backstop: the supervisor enforces each test
    proc = subprocess.Popen([sys.executable, "-I", "-S", "-B", SUPERVISOR],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={}, cwd="/", start_new_session=True)
    try:
        out, err = proc.communicate(job.encode(), timeout=deadline)
    except subprocess.TimeoutExpired:
        # Not reaped yet, so the group id is still ours; each bwrap dies with it (parent-death signal).
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        remove_cgroups(f"ragen2-sbx-{proc.pid}-")
        return [TestResult("sandbox_error", f"supervisor exceeded {deadline:.0f}s")] * len(tests)
    try:
        raw = json.loads(out)
    except ValueError:
        why = err.decode(errors="replace").strip()[-ERR_TAIL:] or f"exit code {proc.returncode}"
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

