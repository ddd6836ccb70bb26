"""Sandbox cost per graded reply: five call tests of a correct program, in one process, alternating:
  bare      one `python -I -S` process per test, no isolation at all (the floor: an interpreter start)
  sandbox   sandbox.run_tests: one bubblewrap sandbox with its own cgroups per test
``ratio`` = sandbox s / bare s per reply. Needs root and bubblewrap. The last line printed is one
JSON object.

    python benchmarks/sandbox.py [--repeats 10] [--tests 5]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from ragen2_core.envs import sandbox

PROGRAM = "def solve(x):\n    return x + 1"


def bare(n: int) -> None:
    code = PROGRAM + "\nimport sys\nprint(solve(int(sys.argv[1])))"
    for i in range(n):
        subprocess.run([sys.executable, "-I", "-S", "-c", code, str(i)], capture_output=True, check=True)


def sandboxed(n: int) -> None:
    results = sandbox.run_tests(PROGRAM, [sandbox.Test(call="solve", args=[i], expected=i + 1) for i in range(n)])
    assert all(r.status == "pass" for r in results), results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--tests", type=int, default=5)
    args = p.parse_args()
    problem = sandbox.isolation_problem()
    if problem:
        sys.exit(f"no sandbox here: {problem}")
    total = {"bare": 0.0, "sandbox": 0.0}
    for _ in range(args.repeats):
        for name, f in (("bare", bare), ("sandbox", sandboxed)):
            t0 = time.perf_counter()
            f(args.tests)
            total[name] += time.perf_counter() - t0
    per = {k: round(v / args.repeats, 4) for k, v in total.items()}
    print(f"per reply of {args.tests} tests: bare {per['bare']:.3f} s, sandbox {per['sandbox']:.3f} s")
    print(json.dumps({"tests": args.tests, "repeats": args.repeats, "bare_s": per["bare"],
                      "sandbox_s": per["sandbox"], "ratio": round(per["sandbox"] / per["bare"], 2)}))


if __name__ == "__main__":
    main()
