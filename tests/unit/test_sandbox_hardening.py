"""The sandbox gaps of issue 31: core dumps reaching the host's core-dump handler, integer answers
graded with the float tolerance, and a pid 1 (bwrap's init, outside seccomp) that the program could
reach. Each test below failed before the fix."""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ragen2_core.envs import sandbox
from ragen2_core.envs.sandbox import host
from ragen2_core.envs.sandbox import Limits, Test, run_tests, stdout_matches, values_match

# Tests marked with the `sandbox` fixture fail loudly, with the reason, where programs cannot be sandboxed.
FAST = Limits(wall_s=5, cpu_s=2, memory_mb=256, max_procs=8, output_bytes=4096)
BIG = 1000000000007
CORE_TEST_VARIABLE = "RAGEN2_TEST_CORE_PATTERN"


def printed(program: str) -> list[str]:
    """What the program printed, one verdict per line (the test expects nothing, so it fails)."""
    [r] = run_tests(program, [Test(expected_stdout="-")], FAST)
    assert r.status == "wrong_answer", (r.status, r.detail)
    return r.stdout.split()


# ---------------------------------------------------------------------------- grading

@pytest.mark.parametrize("got", [BIG + 1, BIG + 1000, BIG + 0.4, float(BIG + 5000), True, str(BIG)])
def test_an_integer_answer_is_graded_exactly(got):
    assert not values_match(got, BIG)
    assert not values_match([got], [BIG]) and not values_match({"a": got}, {"a": BIG})


def test_an_integer_answer_equal_in_value_passes():
    assert values_match(BIG, BIG) and values_match(float(BIG), BIG) and values_match(2 ** 80, 2 ** 80)
    assert not values_match(float(2 ** 53 + 1), 2 ** 53 + 1)  # the float is 2**53: not the answer


def test_a_declared_float_keeps_its_tolerance():
    assert values_match(0.1 + 0.2, 0.3) and values_match(2, 2.0) and values_match(1e12 + 0.4, 1e12)
    assert not values_match(0.31, 0.3) and not values_match(10 ** 400, 1.5)


@pytest.mark.parametrize("got", [str(BIG + 1), str(BIG + 1000), f"{BIG}.4", f"{BIG + 5000}.0", "1e12"])
def test_an_integer_token_on_stdout_is_graded_exactly(got):
    assert not stdout_matches(f"{got}\n", f"{BIG}\n")


def test_stdout_tokens_equal_as_integers_or_within_a_declared_float():
    assert stdout_matches(f"+{BIG}\n", str(BIG)) and stdout_matches("-0 007", "0 7")
    assert stdout_matches("0.30000000000000004", "0.3") and stdout_matches("3", "3.0")
    assert not stdout_matches("0.31", "0.3") and not stdout_matches("9" * 5000, "9")  # no int() limit error


@pytest.mark.usefixtures("sandbox")
def test_integer_answers_are_graded_exactly_in_the_sandbox():
    results = run_tests(f"def solve(x):\n    return x + 0.4\nprint({BIG + 1})",
                        [Test(call="solve", args=[BIG], expected=BIG), Test(expected_stdout=str(BIG))], FAST)
    assert [r.status for r in results] == ["wrong_answer", "wrong_answer"], results


# ---------------------------------------------------------------------------- core dumps

@pytest.mark.usefixtures("sandbox")
def test_the_program_is_not_dumpable_and_cannot_change_its_core_limit():
    program = ("import ctypes, os, resource, sys\n"
               "libc = ctypes.CDLL(None, use_errno=True)\n"
               "print('limit', *resource.getrlimit(resource.RLIMIT_CORE))\n"
               "print('dumpable', libc.prctl(3, 0, 0, 0, 0))\n"                           # PR_GET_DUMPABLE
               "print('set-dumpable', libc.prctl(4, 1, 0, 0, 0), ctypes.get_errno())\n"   # PR_SET_DUMPABLE 1
               "try:\n"
               "    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))\n"
               "    print('lowered')\n"
               "except (OSError, ValueError):\n"
               "    print('refused')\n"
               "new = (ctypes.c_ulong * 2)(0, 0)\n"
               "print('prlimit', libc.syscall(302, 0, 4, new, None), ctypes.get_errno())\n"  # prlimit64(CORE)
               "print('after', *resource.getrlimit(resource.RLIMIT_CORE))\n")
    assert printed(program) == ["limit", "1", "1", "dumpable", "0", "set-dumpable", "-1", "1", "refused",
                                "prlimit", "-1", "1", "after", "1", "1"]


@pytest.mark.usefixtures("sandbox")
def test_a_program_that_executes_itself_keeps_the_core_limit():
    program = ("import os, sys\n"
               "os.execv(sys.executable, [sys.executable, '-c', "
               "'import resource; print(*resource.getrlimit(resource.RLIMIT_CORE))'])\n")
    [r] = run_tests(program, [Test(expected_stdout="-")], FAST)
    assert r.stdout.split() == ["1", "1"], (r.status, r.detail)  # no report: the runner was replaced


@pytest.mark.parametrize("pattern", ["core", "/var/crash/core.%e.%p", "|/usr/share/apport/apport -p%p -s%s",
                                     "|/lib/systemd/systemd-coredump %P %u %g %s %t %c %h", ""])
def test_file_and_pipe_core_patterns_are_contained(pattern, monkeypatch):
    monkeypatch.delenv(sandbox.ALLOW_CORE_SOCKET, raising=False)
    assert sandbox.core_pattern_problem(pattern) is None


def test_a_core_dump_socket_is_refused_unless_accepted(monkeypatch):
    monkeypatch.delenv(sandbox.ALLOW_CORE_SOCKET, raising=False)
    problem = sandbox.core_pattern_problem("@/run/systemd/coredump.socket")
    assert "'@/run/systemd/coredump.socket'" in problem and "kernel.core_pattern=core" in problem
    assert f"{sandbox.ALLOW_CORE_SOCKET}=1" in problem
    monkeypatch.setenv(sandbox.ALLOW_CORE_SOCKET, "1")
    assert sandbox.core_pattern_problem("@/run/systemd/coredump.socket") is None


def test_the_check_reads_the_hosts_core_pattern(tmp_path, monkeypatch):
    assert sandbox.read_core_pattern() == Path("/proc/sys/kernel/core_pattern").read_text().strip()
    fake = tmp_path / "core_pattern"
    fake.write_text("@/run/coredump.socket\n")
    monkeypatch.setattr(host, "CORE_PATTERN", str(fake))
    monkeypatch.delenv(sandbox.ALLOW_CORE_SOCKET, raising=False)
    assert "'@/run/coredump.socket'" in sandbox.core_pattern_problem()


@pytest.mark.usefixtures("sandbox")
def test_the_code_env_refuses_a_core_dump_socket(tmp_path, monkeypatch):
    from ragen2_core.envs.code import CodeEnv

    fake = tmp_path / "core_pattern"
    fake.write_text("@/run/coredump.socket\n")
    monkeypatch.setattr(host, "CORE_PATTERN", str(fake))
    monkeypatch.setattr(sandbox, "_PROBLEM", [])
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.delenv(sandbox.ALLOW_CORE_SOCKET, raising=False)
    with pytest.raises(sandbox.SandboxUnavailable, match=sandbox.ALLOW_CORE_SOCKET):
        CodeEnv()


@pytest.mark.usefixtures("sandbox")
def test_a_crash_never_reaches_a_pipe_core_dump_helper(tmp_path):
    """Sets kernel.core_pattern to a pipe helper for a few seconds (a machine-wide setting, restored
    after), so it runs only when asked: RAGEN2_TEST_CORE_PATTERN=1."""
    if os.environ.get(CORE_TEST_VARIABLE) != "1":
        why = (f"changes the machine-wide kernel.core_pattern for a few seconds; set {CORE_TEST_VARIABLE}=1 "
               "to run it (root, writable /proc/sys)")
        print(f"\nskipped: {why}", file=sys.stderr)
        pytest.skip(why)
    tmp_path.chmod(0o755)
    log, helper = tmp_path / "log", tmp_path / "helper.sh"
    helper.write_text(f"#!/bin/sh\necho \"$1 $(wc -c)\" >> {log}\n")
    helper.chmod(0o755)
    pattern = Path(host.CORE_PATTERN)
    old = pattern.read_text()
    crash = "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)"
    reexec = ("import os, sys\nos.execv(sys.executable, [sys.executable, '-c', "
              "'import os, signal; os.kill(os.getpid(), signal.SIGSEGV)'])")
    try:
        pattern.write_text(f"|{helper} %p")
        # The control: a crash outside the sandbox, with cores allowed, does reach the helper.
        subprocess.run([sys.executable, "-c", "import os, resource, signal; resource.setrlimit("
                        "resource.RLIMIT_CORE, (-1, -1)); os.kill(os.getpid(), signal.SIGSEGV)"])
        deadline = time.monotonic() + 10
        while not log.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert log.exists(), "the helper never ran for a crash outside the sandbox: the test cannot judge"
        log.unlink()
        results = run_tests(crash, [Test(expected_stdout="-")], FAST) + run_tests(reexec, [Test(expected_stdout="-")], FAST)
        time.sleep(2)
    finally:
        pattern.write_text(old)
    assert [r.status for r in results] == ["crash", "crash"] and "SIGSEGV" in results[1].detail, results
    assert not log.exists(), f"the core-dump helper ran for a sandboxed crash: {log.read_text()}"


# ---------------------------------------------------------------------------- pid 1

@pytest.mark.usefixtures("sandbox")
def test_pid_1_is_under_seccomp_and_closed_to_the_program():
    program = ("import ctypes, os\n"
               "libc = ctypes.CDLL(None, use_errno=True)\n"
               "def attempt(name, f):\n"
               "    try:\n"
               "        f()\n"
               "        print(name, 'allowed')\n"
               "    except OSError:\n"
               "        print(name, 'denied')\n"
               "attempt('exe', lambda: os.readlink('/proc/1/exe'))\n"
               "attempt('mem', lambda: open('/proc/1/mem', 'r+b'))\n"
               "attempt('environ', lambda: open('/proc/1/environ').read())\n"
               "def getfd():\n"
               "    pidfd = os.pidfd_open(1)\n"
               "    if libc.syscall(438, pidfd, 0, 0) < 0:\n"   # pidfd_getfd(pidfd, 0, 0)
               "        raise OSError(ctypes.get_errno(), 'pidfd_getfd')\n"
               "attempt('getfd', getfd)\n"
               "status = dict(l.split(':\\t', 1) for l in open('/proc/1/status').read().splitlines() if ':\\t' in l)\n"
               "print('seccomp', status['Seccomp'].strip(), 'nonewprivs', status['NoNewPrivs'].strip())\n"
               "print('me', 'pid1' if os.getpid() == 1 else 'child')\n")
    assert printed(program) == ["exe", "denied", "mem", "denied", "environ", "denied", "getfd", "denied",
                                "seccomp", "2", "nonewprivs", "1", "me", "child"]


@pytest.mark.usefixtures("sandbox")
def test_the_program_cannot_stop_or_kill_pid_1():
    program = ("import os, signal\n"
               "for sig in (signal.SIGKILL, signal.SIGSTOP, signal.SIGTERM, signal.SIGINT):\n"
               "    os.kill(1, sig)\n"
               "print('done')\n")
    [r] = run_tests(program, [Test(expected_stdout="done")], FAST)
    assert r.status == "pass", r.detail
