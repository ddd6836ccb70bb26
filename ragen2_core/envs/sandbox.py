"""Run model-written Python against tests: one fresh process per test, isolated, reported.

    from ragen2_core.envs.sandbox import Limits, Test, run_tests
    results = run_tests("def solve(x):\n    return x + 1",
                        [Test(call="solve", args=[1], expected=2), Test(call="solve", args=[5], expected=7)],
                        Limits(wall_s=2.0))
    [r.status for r in results]        # ['pass', 'wrong_answer']
    run_tests("print(int(input()) * 2)", [Test(stdin="21\n", expected_stdout="42")])  # stdin/stdout test

    python -I -S ragen2_core/envs/sandbox.py < job.json     # the supervisor (internal; root only)

How a program is contained (Linux, run as root; anything less is refused, see ``isolation_problem``):

* The parent starts a separate supervisor interpreter (``python -I -S`` this file, empty environment,
  own process group via setsid). It calls ``unshare`` for fresh mount, network, PID and IPC namespaces and forks
  the namespace's PID 1 (still trusted code). The network namespace has only a downed loopback,
  so the program cannot reach any address, including the host's 127.0.0.1.
* PID 1 mounts size-capped tmpfs file systems: a fresh /tmp per test (the working directory,
  gone with the unmount after the test), a root-only /var/tmp for the captured output, /dev/shm;
  a fresh /proc (host processes invisible) and a read-only view of the standard library (the
  interpreter may live under a private home); ``hide`` paths, e.g. the test data, are covered
  with empty mounts.
* Per test, PID 1 forks a child that sets rlimits (CPU seconds, address space, processes, open
  files, file size = output cap, no core dumps), sets no-new-privileges, drops to an unprivileged
  uid/gid (nobody) with no groups, so the process limit binds, then runs the program with a cleared
  environment in its own empty working directory. stdout/stderr go to root-owned files, so output
  is capped by the file-size limit rather than by reading a pipe.
* PID 1 enforces each test's wall clock, then kills every other process in the namespace (fork
  bombs and daemons included) before the next test; when it exits the kernel kills whatever is
  left and the tmpfs mounts vanish. The parent also kills the supervisor's whole process group
  after an overall deadline.

The expected outputs never enter the sandbox: the program's stdout or return value comes back
and is compared here, so a program cannot read the answers out of its own memory.
"""
from __future__ import annotations

import builtins
import ctypes
import json
import os
import resource
import select
import signal
import sys
import time

# One status per test. Everything except "pass" is a failure kind counted in metrics.
STATUSES = ("pass", "wrong_answer", "timeout", "memory", "crash", "output_limit", "syntax_error",
            "sandbox_error")

_CLONE_NEWNS, _CLONE_NEWIPC, _CLONE_NEWNET, _CLONE_NEWPID = 0x20000, 0x8000000, 0x40000000, 0x20000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
_MNT_DETACH = 2
_FLAGS = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS = 1, 38
_IO_DIR = "/var/tmp"       # root-only inside the sandbox: the tests' stdin and captured output
_ERR_TAIL = 2000            # bytes of stderr kept for the failure detail
_EXIT_SETUP = 251          # the test process failed before the program started


# ============================================================================ parent side

class SandboxUnavailable(RuntimeError):
    """This machine cannot isolate programs as required; the message says why and what to do."""


class Limits:
    """Per-test resource limits. ``hide``: host paths covered by empty mounts inside the sandbox."""

    def __init__(self, *, wall_s: float = 2.0, cpu_s: int = 1, memory_mb: int = 256, max_procs: int = 8,
                 max_files: int = 32, output_bytes: int = 65536, disk_mb: int = 16, uid: int = 65534,
                 gid: int = 65534, hide: tuple[str, ...] = ()):
        if wall_s <= 0 or cpu_s < 1 or memory_mb < 32 or max_procs < 1 or max_files < 8:
            raise ValueError(f"limits too small: wall_s={wall_s} (> 0), cpu_s={cpu_s} (>= 1), "
                             f"memory_mb={memory_mb} (>= 32), max_procs={max_procs} (>= 1), "
                             f"max_files={max_files} (>= 8)")
        if uid == 0 or gid == 0:
            raise ValueError("uid/gid 0 would run the program as root; use an unprivileged id such as 65534")
        self.wall_s, self.cpu_s, self.memory_mb, self.max_procs = wall_s, cpu_s, memory_mb, max_procs
        self.max_files, self.output_bytes, self.disk_mb = max_files, output_bytes, disk_mb
        self.uid, self.gid, self.hide = uid, gid, tuple(hide)

    def job(self) -> dict:
        return dict(cpu_s=self.cpu_s, memory=self.memory_mb << 20, max_procs=self.max_procs,
                    max_files=self.max_files, output_bytes=self.output_bytes, disk_mb=self.disk_mb,
                    uid=self.uid, gid=self.gid, hide=[os.path.abspath(p) for p in self.hide],
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
    """Run ``program`` once per test, each in its own process with its own timeout."""
    import subprocess

    limits = limits or Limits()
    if not tests:
        return []
    problem = isolation_problem()
    if problem:
        raise SandboxUnavailable(problem)
    cases = [{"stdin": t.stdin, "call": t.call, "args": t.args} for t in tests]
    job = json.dumps({"program": program, "cases": cases, **limits.job()})
    deadline = len(tests) * (limits.wall_s + 1.0) + 10.0  # generous: PID 1 enforces each test itself
    proc = subprocess.Popen([sys.executable, "-I", "-S", "-B", os.path.abspath(__file__)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={}, cwd="/", start_new_session=True)
    try:
        out, err = proc.communicate(job.encode(), timeout=deadline)
    except subprocess.TimeoutExpired:
        # Not reaped yet, so the group id is still ours; its PID 1 dies with it (parent-death signal).
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
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
    report, sig = r["report"], r["signal"]
    err = r["stderr"]
    res = lambda status, detail="": TestResult(status, detail, r["stdout"], r["wall_s"])  # noqa: E731
    if r["timed_out"]:
        return res("timeout", f"wall clock over {limits.wall_s:g}s")
    if sig == signal.SIGXCPU:
        return res("timeout", f"CPU time over {limits.cpu_s}s")
    if sig == signal.SIGXFSZ or r["stdout_bytes"] >= limits.output_bytes or r["report_bytes"] >= limits.output_bytes:
        return res("output_limit", f"output over {limits.output_bytes} bytes")
    if report is None:
        if r["exit"] == _EXIT_SETUP and not r["stdout"]:
            return res("sandbox_error", f"test process setup failed: {err[-200:].strip()}")
        if "MemoryError" in err:
            return res("memory", "MemoryError")
        why = f"killed by {_signal_name(sig)}" if sig else f"exit code {r['exit']}"
        return res("crash", f"{why}: {err[-200:].strip()}" if err.strip() else why)
    error = report.get("error")
    if error == "MemoryError":
        return res("memory", "MemoryError")
    if error in ("SyntaxError", "IndentationError", "TabError"):
        return res("syntax_error", f"{error}: {report.get('msg', '')}")
    if error:
        return res("crash", f"{error}: {report.get('msg', '')}")
    if test.call is not None:
        ok = values_match(report.get("value"), test.expected)
        return res("pass" if ok else "wrong_answer", "" if ok else f"returned {report.get('value')!r:.80}")
    ok = stdout_matches(r["stdout"], test.expected_stdout)
    return res("pass" if ok else "wrong_answer", "" if ok else "stdout differs")


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def stdout_matches(got: str, expected: str) -> bool:
    """Whitespace-insensitive token match; numeric tokens may differ by 1e-6 (relative or absolute)."""
    a, b = got.split(), expected.split()
    return len(a) == len(b) and all(x == y or _close(x, y) for x, y in zip(a, b))


def values_match(got, expected) -> bool:
    """Equality of JSON values (tuples are lists); floats within 1e-6."""
    if isinstance(expected, bool) or isinstance(got, bool):
        return got is expected
    if isinstance(expected, (int, float)) and isinstance(got, (int, float)):
        return got == expected or abs(got - expected) <= 1e-6 * max(1.0, abs(expected))
    if isinstance(expected, (list, tuple)) and isinstance(got, (list, tuple)):
        return len(got) == len(expected) and all(values_match(g, e) for g, e in zip(got, expected))
    if isinstance(expected, dict) and isinstance(got, dict):
        return got.keys() == expected.keys() and all(values_match(got[k], expected[k]) for k in expected)
    return got == expected


def _close(x: str, y: str) -> bool:
    try:
        fx, fy = float(x), float(y)
    except ValueError:
        return False
    return abs(fx - fy) <= 1e-6 * max(1.0, abs(fy))


_PROBLEM: list[str | None] = []  # cached result of the one probe per process


def isolation_problem() -> str | None:
    """Why this machine cannot sandbox programs (None when it can). Probed once per process."""
    if _PROBLEM:
        return _PROBLEM[0]
    if not sys.platform.startswith("linux"):
        problem = f"the sandbox needs Linux namespaces; this is {sys.platform}. Run code envs on Linux."
    elif os.geteuid() != 0:
        problem = ("the sandbox needs root to create namespaces and drop to an unprivileged uid (so the "
                   f"process limit binds); this process runs as uid {os.geteuid()}. Run training as root "
                   "(e.g. in the project's container) or use a math/grid env.")
    else:
        _PROBLEM.append(None)  # let the probe itself run
        try:
            [r] = run_tests("print(1)", [Test(expected_stdout="1")], Limits(wall_s=10.0))
            problem = None if r.status == "pass" else (
                f"the sandbox self-test failed ({r.status}: {r.detail}). Namespaces need CAP_SYS_ADMIN: in "
                "a container, run it with --cap-add SYS_ADMIN (or --privileged), or use a math/grid env.")
        finally:
            _PROBLEM.clear()
    _PROBLEM.append(problem)
    return problem


# ============================================================================ supervisor side
# Everything below runs in the supervisor interpreter started by run_tests (stdlib only).

def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    return libc


def _check(rc: int, what: str) -> None:
    if rc != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _supervise() -> None:
    job = json.loads(sys.stdin.buffer.read())
    libc = _libc()
    try:
        _check(libc.unshare(_CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWPID | _CLONE_NEWIPC), "unshare")
    except OSError as e:
        sys.stdout.write(json.dumps({"error": f"cannot create namespaces ({e}); needs root with CAP_SYS_ADMIN"}))
        sys.exit(0)
    pid = os.fork()
    if pid == 0:
        _init(job, libc)  # never returns
    _, status = os.waitpid(pid, 0)
    sys.exit(os.waitstatus_to_exitcode(status) & 0xFF)


def _init(job: dict, libc) -> None:
    """PID 1 of the fresh namespaces: private mounts, then one child per test."""
    try:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # supervisor killed -> namespace dies
        _private_mounts(job, libc)
        results = [_run_case(job, i, case, libc) for i, case in enumerate(job["cases"])]
        data = json.dumps(results).encode()
    except BaseException as e:  # noqa: BLE001 - report any setup failure instead of hanging the parent
        data = json.dumps({"error": f"sandbox setup failed: {type(e).__name__}: {e}"}).encode()
    view = memoryview(data)
    while view:
        view = view[os.write(1, view):]
    os._exit(0)


def _private_mounts(job: dict, libc) -> None:
    _check(libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None), "make mounts private")
    # The test files (stdin, captured output) live in a root-only tmpfs sized for them, apart from
    # the program's /tmp, so a program that fills its own space cannot break the bookkeeping.
    io_mb = 1 + (sum(len(c["stdin"].encode()) for c in job["cases"])
                 + len(job["cases"]) * (3 * job["output_bytes"] + _ERR_TAIL + 4096)) // (1 << 20)
    _check(libc.mount(b"tmpfs", _IO_DIR.encode(), b"tmpfs", _FLAGS, f"size={io_mb}m,mode=700".encode()),
           f"mount tmpfs on {_IO_DIR}")
    if os.path.isdir("/dev/shm"):
        _check(libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", _FLAGS, b"size=1m,mode=1777"), "mount tmpfs on /dev/shm")
    if libc.mount(b"proc", b"/proc", b"proc", _FLAGS, None) != 0:
        pass  # a fresh /proc only hides host processes; uid nobody cannot read theirs anyway
    for path in job["hide"]:
        if os.path.isdir(path):
            _check(libc.mount(b"tmpfs", path.encode(), b"tmpfs", _FLAGS | _MS_RDONLY, b"size=4k,mode=755"),
                   f"hide {path}")
        elif os.path.exists(path):
            _check(libc.mount(b"/dev/null", path.encode(), None, _MS_BIND, None), f"hide {path}")
    # The interpreter may live under a directory the unprivileged user cannot enter (/root/.pyenv):
    # cover the first such directory with an empty tmpfs and bind the standard library back at its
    # own path, read-only, so imports work unchanged while the rest of that directory stays hidden.
    stdlib = os.path.dirname(os.__file__)
    parts = stdlib.split("/")
    for k in range(2, len(parts)):
        closed = "/".join(parts[:k])
        if not os.stat(closed).st_mode & 0o001:
            staged = f"{_IO_DIR}/stdlib".encode()  # park a view of the library before its parent is covered
            os.mkdir(staged, 0o755)
            _check(libc.mount(stdlib.encode(), staged, None, _MS_BIND | _MS_REC, None), "bind stdlib")
            _check(libc.mount(b"tmpfs", closed.encode(), b"tmpfs", _FLAGS, b"size=4k,mode=755"), f"cover {closed}")
            os.makedirs(stdlib, 0o755)
            _check(libc.mount(staged, stdlib.encode(), None, _MS_BIND | _MS_REC, None), "bind stdlib back")
            _check(libc.mount(None, stdlib.encode(), None,
                              _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV, None),
                   "remount stdlib read-only")
            break


def _run_case(job: dict, i: int, case: dict, libc) -> dict:
    # A fresh, size-capped /tmp per test: nothing one test writes is seen by the next, and it
    # vanishes with the unmount below whatever the program left in it.
    _check(libc.mount(b"tmpfs", b"/tmp", b"tmpfs", _FLAGS, f"size={job['disk_mb']}m,mode=1777".encode()),
           "mount tmpfs on /tmp")
    work = "/tmp/work"
    os.mkdir(work, 0o700)
    os.chown(work, job["uid"], job["gid"])
    files = {name: f"{_IO_DIR}/{name}{i}" for name in ("in", "out", "err", "res")}
    with open(files["in"], "w") as f:
        f.write(case["stdin"])
    fds = {name: os.open(path, os.O_RDONLY if name == "in" else os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
           for name, path in files.items()}
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            _child(job, case, fds, work)
        finally:
            os._exit(_EXIT_SETUP)
    for fd in fds.values():
        os.close(fd)
    pidfd = os.pidfd_open(pid)
    timed_out = not select.select([pidfd], [], [], job["wall_s"])[0]
    if timed_out:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    os.close(pidfd)
    wall = time.monotonic() - t0
    # Kill whatever the test left behind (forks, daemons) and reap it: we are PID 1 here.
    try:
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
        pass
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
    _check(libc.umount2(b"/tmp", _MNT_DETACH), "unmount /tmp")
    cap = job["output_bytes"]
    stdout, n_out = _read(files["out"], cap)
    report_text, n_rep = _read(files["res"], cap)
    try:
        report = json.loads(report_text) if report_text else None
    except ValueError:
        report = None
    err_size = os.path.getsize(files["err"])
    with open(files["err"], "rb") as f:
        f.seek(max(0, err_size - _ERR_TAIL))
        stderr = f.read().decode(errors="replace")
    return dict(timed_out=timed_out, signal=os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
                exit=os.WEXITSTATUS(status) if os.WIFEXITED(status) else None, stdout=stdout,
                stdout_bytes=n_out, report=report if isinstance(report, dict) else None,
                report_bytes=n_rep, stderr=stderr, wall_s=round(wall, 4))


def _read(path: str, cap: int) -> tuple[str, int]:
    with open(path, "rb") as f:
        return f.read(cap).decode(errors="replace"), os.path.getsize(path)


def _child(job: dict, case: dict, fds: dict, work: str) -> None:
    """The test process: limits, unprivileged uid, clean environment, then the program."""
    for target, name in ((0, "in"), (1, "out"), (2, "err"), (3, "res")):
        os.dup2(fds[name], target)
    os.closerange(4, 65536)
    n = job["output_bytes"]
    for what, value in ((resource.RLIMIT_CPU, (job["cpu_s"], job["cpu_s"] + 1)),
                        (resource.RLIMIT_AS, (job["memory"],) * 2), (resource.RLIMIT_NPROC, (job["max_procs"],) * 2),
                        (resource.RLIMIT_NOFILE, (job["max_files"],) * 2), (resource.RLIMIT_FSIZE, (n, n)),
                        (resource.RLIMIT_CORE, (0, 0))):
        resource.setrlimit(what, value)
    ctypes.CDLL(None).prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    os.setgroups([])
    os.setgid(job["gid"])
    os.setuid(job["uid"])
    if os.getuid() == 0 or os.geteuid() == 0:
        os._exit(_EXIT_SETUP)  # never run a program as root
    os.chdir(work)
    os.umask(0o077)
    os.environ.clear()
    os.environ.update(PATH="/usr/bin:/bin", HOME=work, LANG="C.UTF-8")
    sys.argv = ["solution.py"]
    sys.stdin = open(0, encoding="utf-8", errors="replace", closefd=False)
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False)
    sys.stderr = open(2, "w", encoding="utf-8", closefd=False, buffering=1)
    is_call = case["call"] is not None
    namespace = {"__name__": "__solution__" if is_call else "__main__", "__builtins__": builtins}
    report: dict = {}
    try:
        code = compile(job["program"], "<solution>", "exec")
        exec(code, namespace)
        if is_call:
            report["value"] = _target(namespace, case["call"])(*case["args"])
    except SystemExit as e:
        if is_call or e.code not in (None, 0):
            report = {"error": "SystemExit", "msg": str(e.code)}
    except BaseException as e:  # noqa: BLE001 - every failure of the program is reported, not raised
        report = {"error": type(e).__name__, "msg": str(e)[:200]}
    try:
        sys.stdout.flush()
    except OSError as e:
        report = report or {"error": "OSError", "msg": str(e)[:200]}
    try:
        os.write(3, json.dumps(report, default=repr).encode())
    except (OSError, ValueError):  # over the output cap, or a value json cannot write (a cycle)
        pass
    os._exit(0)


def _target(namespace: dict, name: str):
    if callable(namespace.get(name)):
        return namespace[name]
    if isinstance(namespace.get("Solution"), type):  # LeetCode style: class Solution with the method
        return getattr(namespace["Solution"](), name)
    raise NameError(f"the program defines no function {name!r}")


if __name__ == "__main__":
    _supervise()
