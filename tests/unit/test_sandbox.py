"""The sandbox: hostile programs are contained and reported, the test process and the machine are
unharmed. Every limit is small (1-2 s, 256 MiB, 8 processes), so a broken limit costs seconds,
and the fork test is bounded by the program itself (500 forks at most)."""
import os
import signal
import socket
import time
from pathlib import Path

import pytest

from ragen2_core.envs import sandbox
from ragen2_core.envs.sandbox import Limits, Test, run_tests

pytestmark = pytest.mark.usefixtures("sandbox")  # fails loudly where programs cannot be sandboxed
FAST = Limits(wall_s=1.5, cpu_s=1, memory_mb=256, max_procs=8, output_bytes=4096)
REPO_FILE = Path(sandbox.__file__).resolve()


def run_one(program: str, limits: Limits = FAST, stdin: str = "") -> sandbox.TestResult:
    [result] = run_tests(program, [Test(stdin=stdin, expected_stdout="done")], limits)
    return result


def processes_with(marker: str) -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                found.append(pid)
        except OSError:
            pass
    return found


# ---------------------------------------------------------------------------- verdicts

def test_pass_wrong_answer_and_stdio():
    results = run_tests("def solve(x):\n    return x + 1",
                        [Test(call="solve", args=[1], expected=2), Test(call="solve", args=[5], expected=7)], FAST)
    assert [r.status for r in results] == ["pass", "wrong_answer"]
    [r] = run_tests("a, b = map(int, input().split())\nprint(a * b)", [Test(stdin="6 7\n", expected_stdout="42\n")], FAST)
    assert r.status == "pass" and r.stdout == "42\n"


def test_one_hanging_test_does_not_zero_the_others():
    program = "def solve(x):\n    while x == 3:\n        pass\n    return 2 * x"
    tests = [Test(call="solve", args=[x], expected=2 * x) for x in (1, 3, 4)]
    t0 = time.monotonic()
    assert [r.status for r in run_tests(program, tests, FAST)] == ["pass", "timeout", "pass"]
    assert time.monotonic() - t0 < 10


@pytest.mark.parametrize("program, status, detail", [
    ("def f(:\n    pass", "syntax_error", "SyntaxError"),
    ("raise ValueError('boom')", "crash", "ValueError: boom"),
    ("import sys\nsys.exit(3)", "crash", "SystemExit: 3"),
    ("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)", "crash", "SIGSEGV"),
    ("import numpy", "crash", "ModuleNotFoundError"),  # only the standard library is visible
])
def test_failures_are_named(program, status, detail):
    r = run_one(program)
    assert r.status == status and detail in r.detail


def test_standard_library_imports_work():
    r = run_one("import collections.abc, heapq, fractions, itertools, re, json, bisect, math\nprint('done')")
    assert r.status == "pass", r.detail


# ---------------------------------------------------------------------------- hostile programs

def test_infinite_loop_is_stopped_by_the_cpu_limit():
    t0 = time.monotonic()
    r = run_one("while True:\n    pass", Limits(wall_s=6, cpu_s=1))  # a loaded machine must not make it wall time
    assert r.status == "timeout" and "CPU" in r.detail and time.monotonic() - t0 < 10


def test_sleeping_forever_is_stopped_by_the_wall_clock():
    r = run_one("import time\ntime.sleep(600)")
    assert r.status == "timeout" and "wall clock" in r.detail


def test_fork_loop_is_capped_and_every_child_is_killed():
    marker = f"61.{os.getpid()}"  # each child sleeps with the marker in its command line
    program = ("import os, sys\n"
               "for _ in range(500):\n"  # bounded, so a broken limit cannot take the machine down
               "    if os.fork() == 0:\n"
               f"        os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep({marker})'])\n")
    r = run_one(program)
    assert r.status == "crash" and "Resource temporarily unavailable" in r.detail  # the process limit binds
    time.sleep(0.2)
    assert processes_with(marker) == []


def test_memory_balloon_is_reported():
    assert run_one("x = bytearray(10**10)").status == "memory"
    assert run_one("chunks = []\nwhile True:\n    chunks.append(b'x' * 10**6)").status == "memory"


def test_printing_gigabytes_is_capped():
    t0 = time.monotonic()
    r = run_one("while True:\n    print('x' * 100_000)")
    assert r.status == "output_limit" and len(r.stdout) <= FAST.output_bytes and time.monotonic() - t0 < 10


def test_writing_outside_its_directory_leaves_the_host_untouched(tmp_path):
    tmp_path.chmod(0o777)
    targets = [Path(f"/tmp/ragen2-sandbox-escape-{os.getpid()}"), tmp_path / "escape.txt",
               REPO_FILE.parent / "escape.txt", Path("/root/escape.txt")]
    program = ("import os\n"
               f"for path in {[str(t) for t in targets]!r}:\n"
               "    try:\n"
               "        open(path, 'w').write('escaped')\n"
               "    except OSError as e:\n"
               "        print(type(e).__name__)\n"
               "open('mine.txt', 'w').write('fine')\n"  # its own directory is writable
               "print(open('mine.txt').read())\n")
    r = run_one(program)
    assert r.status == "wrong_answer" and r.stdout.strip().endswith("fine")
    assert not any(t.exists() for t in targets)


def test_deleting_files_it_did_not_create_fails(tmp_path):
    victim = Path(f"/tmp/ragen2-sandbox-victim-{os.getpid()}")
    victim.write_text("keep me")
    victim.chmod(0o666)
    try:
        program = ("import os, shutil\n"
                   f"for path in [{str(victim)!r}, {str(REPO_FILE)!r}]:\n"
                   "    try:\n"
                   "        os.remove(path)\n"
                   "    except OSError as e:\n"
                   "        print(type(e).__name__)\n"
                   f"shutil.rmtree({str(REPO_FILE.parent)!r}, ignore_errors=True)\n")
        run_one(program)
        assert victim.read_text() == "keep me" and REPO_FILE.exists()
    finally:
        victim.unlink()


def test_no_network_even_to_a_loopback_port_the_test_opens():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.settimeout(0.5)
        port = server.getsockname()[1]
        r = run_one(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\nprint('done')")
        assert r.status == "crash" and ("unreachable" in r.detail or "refused" in r.detail)
        with pytest.raises(socket.timeout):
            server.accept()


def test_environment_secrets_are_not_visible(monkeypatch):
    monkeypatch.setenv("RAGEN2_TEST_SECRET", "hunter2")
    program = ("import os\n"
               "print(dict(os.environ))\n"
               f"for pid in ['1', 'self', '{os.getpid()}']:\n"
               "    try:\n"
               "        print(open(f'/proc/{pid}/environ').read())\n"
               "    except OSError as e:\n"
               "        print(type(e).__name__)\n")
    r = run_one(program)
    assert "PATH" in r.stdout and "hunter2" not in r.stdout and "RAGEN2_TEST_SECRET" not in r.stdout


def test_killing_the_parent_fails_and_is_reported():
    program = ("import os, signal\n"
               f"os.kill({os.getpid()}, signal.SIGKILL)\n"
               "os.kill(os.getppid(), signal.SIGKILL)\n")
    r = run_one(program)
    assert r.status == "crash" and ("ProcessLookupError" in r.detail or "PermissionError" in r.detail)
    # Still here; and the sandbox still works afterwards.
    assert run_one("print('done')").status == "pass"


def test_limits_reject_silly_values():
    with pytest.raises(ValueError, match="wall_s"):
        Limits(wall_s=0)
    with pytest.raises(ValueError, match="exactly one"):
        Test(stdin="x")


def test_signal_names_in_details_are_readable():
    r = run_one("import os, signal\nos.kill(os.getpid(), signal.SIGABRT)")
    assert r.status == "crash" and signal.SIGABRT.name in r.detail


# ---------------------------------------------------------------------------- escapes that the
# previous, self-built sandbox let through (each of these passed there)

DATA = Path(__file__).parents[1] / "fixtures" / "deepcoder_small.jsonl"


def probe(program: str, limits: Limits = FAST) -> list[str]:
    """Lines the program printed (it prints one verdict per attempt)."""
    r = run_one(program, limits)
    assert r.status in ("wrong_answer", "pass"), (r.status, r.detail)
    return r.stdout.split()


def test_the_root_holds_only_the_interpreter_and_its_standard_library(tmp_path):
    readable = [str(REPO_FILE), str(DATA), str(REPO_FILE.parents[2]), "/etc/passwd", "/usr/bin",
                os.getcwd(), str(Path(os.__file__).parent / "site-packages")]
    program = ("import os\n"
               f"for path in {readable!r}:\n"
               "    try:\n"
               "        open(path).read(1) if os.path.isfile(path) else os.listdir(path)[0]\n"
               "        print('read')\n"
               "    except (OSError, IndexError):\n"
               "        print('denied')\n")
    assert probe(program) == ["denied"] * len(readable)
    top = probe("import os\nprint(*sorted(os.listdir('/')))")
    assert set(top) <= {"dev", "etc", "lib", "lib64", "proc", "root", "tmp", "usr"}, top


def test_nothing_written_outside_persists_on_the_host():
    lock = Path(f"/run/lock/ragen2-sandbox-{os.getpid()}")
    program = ("import os\n"
               f"for make in (lambda p: open(p, 'w').write('x'), lambda p: os.symlink('/etc', p), os.mkfifo):\n"
               "    try:\n"
               f"        make({str(lock)!r})\n"
               "        print('made')\n"
               "    except OSError:\n"
               "        print('denied')\n")
    try:
        assert probe(program) == ["denied"] * 3
        assert not os.path.lexists(lock)
    finally:
        if os.path.lexists(lock):
            lock.unlink()


def test_a_host_unix_socket_is_out_of_reach():
    import tempfile

    where = tempfile.mkdtemp(dir="/run")  # not /tmp: the sandbox's /tmp was always private
    os.chmod(where, 0o755)
    path = f"{where}/s"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(path)
        os.chmod(path, 0o777)
        server.listen(1)
        server.settimeout(0.3)
        lines = probe("import socket\n"
                      "try:\n"
                      f"    socket.socket(socket.AF_UNIX).connect({path!r})\n"
                      "    print('connected')\n"
                      "except OSError:\n"
                      "    print('denied')\n")
        assert lines == ["denied"]
        with pytest.raises(socket.timeout):
            server.accept()
    os.unlink(path)
    os.rmdir(where)


def test_dangerous_socket_families_and_syscalls_are_denied():
    program = ("import ctypes, os, socket\n"
               "libc = ctypes.CDLL(None, use_errno=True)\n"
               "def attempt(f):\n"
               "    try:\n"
               "        ok = f()\n"
               "    except OSError:\n"
               "        ok = False\n"
               "    print('allowed' if ok else 'denied')\n"
               "attempt(lambda: socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM))\n"
               "attempt(lambda: socket.socket(socket.AF_ALG, socket.SOCK_SEQPACKET))\n"
               "attempt(lambda: libc.unshare(0x10000000) == 0)\n"            # CLONE_NEWUSER
               "def clone_user():\n"
               "    pid = libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0)\n"  # clone(CLONE_NEWUSER | SIGCHLD)
               "    if pid == 0:\n"
               "        os._exit(0)\n"
               "    return pid > 0\n"
               "attempt(clone_user)\n"
               "attempt(lambda: libc.syscall(101, 0, 0, 0, 0) == 0)\n"      # ptrace(PTRACE_TRACEME)
               "attempt(lambda: libc.syscall(250, 0, -3, 0) >= 0)\n"        # keyctl(GET_KEYRING_ID, session)
               "attempt(lambda: libc.mount(b'none', b'/tmp', b'tmpfs', 0, None) == 0)\n")
    assert probe(program) == ["denied"] * 7


def test_memory_is_capped_for_all_of_a_tests_processes_together():
    # Four children each hold 200 MB against a 256 MB limit: at most one can.
    program = ("import os, time\n"
               "r, w = os.pipe()\n"
               "for _ in range(4):\n"
               "    if os.fork() == 0:\n"
               "        block = b'x' * (200 << 20)\n"
               "        os.write(w, b'1')\n"
               "        time.sleep(3)\n"
               "        os._exit(0)\n"
               "os.close(w)\n"
               "held = 0\n"
               "deadline = time.time() + 2.5\n"
               "while time.time() < deadline and os.read(r, 1):\n"
               "    held += 1\n"
               "print(held)\n")
    # The wall limit leaves room for a loaded machine: at 5 s the children's 3 s sleep plus slow forks
    # ended some runs as a timeout, which says nothing about memory.
    limits = Limits(wall_s=30, cpu_s=10, memory_mb=256, max_procs=8, output_bytes=4096)
    r = run_one(program, limits)
    assert r.status == "memory" or (r.stdout.split() and int(r.stdout.split()[0]) <= 1), (r.status, r.stdout)


def test_sysv_shared_memory_does_not_outlive_its_test():
    program = ("import ctypes\n"
               "libc = ctypes.CDLL(None)\n"
               "key = 0x52414732\n"
               "if libc.shmget(key, 1 << 20, 0) >= 0:\n"
               "    print('inherited')\n"
               "else:\n"
               "    print('made' if libc.shmget(key, 1 << 20, 0o1600) >= 0 else 'failed')\n")  # IPC_CREAT | 0600
    results = run_tests(program, [Test(expected_stdout="made")] * 2, FAST)
    assert [r.stdout.strip() for r in results] == ["made", "made"]


def test_process_limit_is_per_test_not_per_user():
    import threading

    # A fills its own process limit and holds it; B, running meanwhile, still forks.
    hog = ("import os, time\n"
           "for _ in range(20):\n"
           "    try:\n"
           "        if os.fork() == 0:\n"
           "            time.sleep(2)\n"
           "            os._exit(0)\n"
           "    except OSError:\n"
           "        break\n"
           "time.sleep(2)\n")
    limits = Limits(wall_s=4, cpu_s=2, memory_mb=256, max_procs=4, output_bytes=4096)
    hogs = [threading.Thread(target=run_tests, args=(hog, [Test(expected_stdout="")], limits)) for _ in range(2)]
    for t in hogs:
        t.start()
    time.sleep(1.0)
    try:
        r = run_one("import os\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0)\nprint('done')", limits)
    finally:
        for t in hogs:
            t.join()
    assert r.status == "pass", r.detail


def test_the_callers_session_keyring_is_not_visible():
    libc = __import__("ctypes").CDLL(None, use_errno=True)
    payload = b"ragen2-keyring-secret"
    key = libc.syscall(248, b"user", b"ragen2-test-key", payload, len(payload), -3)  # add_key(..., session)
    assert key > 0, f"add_key failed (errno {__import__('ctypes').get_errno()}): cannot set up this test"
    try:
        program = ("import ctypes\n"
                   "libc = ctypes.CDLL(None)\n"
                   "buf = ctypes.create_string_buffer(64)\n"
                   f"n = libc.syscall(250, 11, {key}, buf, 64)\n"  # keyctl(KEYCTL_READ, key)
                   "print(buf.raw[:max(n, 0)])\n"
                   "try:\n"
                   "    print(open('/proc/keys').read())\n"
                   "except OSError as e:\n"
                   "    print(type(e).__name__)\n")
        r = run_one(program)
        assert r.status == "wrong_answer" and "ragen2-keyring-secret" not in r.stdout and "ragen2-test-key" not in r.stdout
    finally:
        libc.syscall(250, 21, key)  # KEYCTL_INVALIDATE


@pytest.mark.parametrize("program, expected", [
    # a JSON bomb written straight into the result channel
    ("import os\nos.write(3, b'[' * 100000 + b']' * 100000)\nos._exit(0)", 1),
    ("def solve(x):\n    v = []\n    for _ in range(100000):\n        v = [v]\n    return v", 1),  # deep return
    ("class Odd:\n    def __repr__(self):\n        raise RuntimeError('no')\n"
     "def solve(x):\n    return Odd()", 1),                                             # un-repr-able
    ("def solve(x):\n    return 10 ** 400", 1.5),                                        # no float fits it
    ("def solve(x):\n    return float('nan')", 1.5),
    ("def solve(x):\n    return 10 ** 5000", 1),                                         # over json's digit limit
    ("import os\nos.write(3, b'{\"value\": ' + b'9' * 5000 + b'}')\nos._exit(0)", 1),
])
def test_hostile_results_are_a_clean_failure_of_that_test(program, expected):
    limits = Limits(wall_s=10, cpu_s=5, output_bytes=1 << 20)  # room for the bombs: they must be parsed
    results = run_tests(program, [Test(call="solve", args=[1], expected=expected),
                                  Test(call="solve", args=[2], expected=expected)], limits)
    assert [r.status for r in results] in (["wrong_answer"] * 2, ["crash"] * 2), results
