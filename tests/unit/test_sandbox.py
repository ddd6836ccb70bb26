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

pytestmark = pytest.mark.skipif(sandbox.isolation_problem() is not None,
                                reason=f"no sandbox here: {sandbox.isolation_problem()}")
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
    r = run_one("while True:\n    pass")
    assert r.status == "timeout" and "CPU" in r.detail and time.monotonic() - t0 < 10


def test_sleeping_forever_is_stopped_by_the_wall_clock():
    r = run_one("import time\ntime.sleep(600)")
    assert r.status == "timeout" and "wall clock" in r.detail


def test_fork_loop_is_capped_and_every_child_is_killed():
    marker = f"61.{os.getpid()}"  # each child becomes `sleep 61.<pid>`, so we can look for survivors
    program = ("import os\n"
               "for _ in range(500):\n"  # bounded, so a broken limit cannot take the machine down
               "    if os.fork() == 0:\n"
               f"        os.execv('/bin/sleep', ['sleep', '{marker}'])\n")
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
        assert r.status == "crash" and "unreachable" in r.detail
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


def test_limits_reject_root_and_silly_values():
    with pytest.raises(ValueError, match="root"):
        Limits(uid=0)
    with pytest.raises(ValueError, match="wall_s"):
        Limits(wall_s=0)
    with pytest.raises(ValueError, match="exactly one"):
        Test(stdin="x")


def test_signal_names_in_details_are_readable():
    r = run_one("import os, signal\nos.kill(os.getpid(), signal.SIGABRT)")
    assert r.status == "crash" and signal.SIGABRT.name in r.detail
