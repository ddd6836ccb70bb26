"""The supervisor: run as ``python -I -S -B supervisor.py < job.json`` by ``run_tests`` (root, empty
environment, own process group), it stages the allow-listed files, then per test makes the cgroups,
forks a child that drops to nobody and executes bwrap, enforces the wall clock and cleans up; the
results go back as JSON on stdout. Standard library only, and it imports nothing of the package:
this file is the whole program that runs as root beside the sandbox. The parent side is in
``__init__.py``, the probe of the host and the seccomp filter in ``host.py``.
"""
import ctypes
import json
import os
import resource
import select
import signal
import sys
import time

ERR_TAIL = 2000      # bytes of stderr kept for the failure detail
SANDBOX_ID = 65534   # the unprivileged uid/gid outside and inside

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
SETUP_S = 20.0  # bwrap and the runner's start, before the program's wall clock runs
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
            "--setenv", "LANG", "C.UTF-8", "--uid", str(SANDBOX_ID), "--gid", str(SANDBOX_ID),
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


def rmdir_cgroup(d: str) -> None:
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
        # up, which is no fault of the program); setup itself gets SETUP_S.
        mark = r["fds"][4]
        ready = select.select([r["pidfd"], mark], [], [], SETUP_S)[0]
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
        rmdir_cgroup(d)  # kills whatever the test left behind (daemons, forks) first
    cap = job["output_bytes"]
    stdout, n_out = _read(fds[1], cap)
    report, n_rep = _read(fds[3], cap)
    stderr, _ = _read(fds[2], ERR_TAIL, tail=True)
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
    os.setgid(SANDBOX_ID)
    os.setuid(SANDBOX_ID)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # after setuid, which clears it
    if os.getppid() == 1:
        os._exit(127)  # the supervisor died before the signal was armed
    os.execve(argv[0], argv, {})


if __name__ == "__main__":
    _supervise()

