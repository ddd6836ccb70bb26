"""Program synthesis as a single-turn text env: the reply's ``<answer>`` is Python code, the reward
is the fraction of the problem's tests it passes, run in the sandbox (``envs/sandbox/``) with
one process and one timeout per test. Success = every test passes.

Problems come from a procedural generator of small function-synthesis tasks (``source="generator"``,
``difficulty`` 1-3: one integer operation, two composed, list tasks) whose expected outputs are
computed from the reference solution, or from a DeepCoder-format JSON / JSONL file
(``source="file"``): rows with ``problem`` and ``tests`` (a JSON string or list of
``{"input", "output", "testtype": "stdin"|"functional"}``, or TACO's ``{"inputs", "outputs",
"fn_name"}``), optional ``metadata.func_name``, ``starter_code`` and ``solutions``. The split is
by content hash, as in ``envs/math.py``.

``StepResult.info`` carries ``tests_passed``, ``tests_total``, ``test_status`` (count per sandbox
status: pass, wrong_answer, timeout, memory, crash, output_limit, syntax_error, sandbox_error) and
``failure`` (the first non-pass status, None when all pass), for the rollout metrics.

    env = CodeEnv(difficulty=1)
    print(env.reset(3))
    env.step("<think>add</think><answer>def solve(x):\\n    return x + 3</answer>").reward
"""
from __future__ import annotations

import functools
import json
import random
import re
import time
import warnings
from dataclasses import dataclass

from . import sandbox
from .math import Problem, SingleTurnEnv, pick, read_rows, split_of

TEMPLATE_THINK = "Let me write the function."
_FENCE = re.compile(r"^\s*```(?:python|py)?\s*\n(.*?)\n?\s*```\s*$", re.DOTALL)


@dataclass(frozen=True)
class CodeProblem(Problem):
    tests: tuple = ()    # sandbox.Test, in order


# ============================================================================ the generator

# (description, code) of one integer step; {e} is the expression so far, {a} a constant.
INT_OPS = [("{e} plus {a}", "{e} + {a}"), ("{e} minus {a}", "{e} - {a}"), ("{e} times {a}", "{e} * {a}"),
           ("{e} floor-divided by {a}", "{e} // {a}"), ("{e} modulo {a}", "{e} % {a}"),
           ("the larger of {e} and {a}", "max({e}, {a})"), ("the smaller of {e} and {a}", "min({e}, {a})"),
           ("the absolute difference of {e} and {a}", "abs({e} - {a})")]
LIST_OPS = [("the sum of the numbers in xs", "sum(xs)"), ("the largest number in xs", "max(xs)"),
            ("the smallest number in xs", "min(xs)"), ("xs sorted in ascending order", "sorted(xs)"),
            ("xs in reverse order", "xs[::-1]"), ("the number of even numbers in xs", "sum(1 for v in xs if v % 2 == 0)"),
            ("the numbers in xs greater than {a}, in order", "[v for v in xs if v > {a}]"),
            ("each number in xs times {a}", "[v * {a} for v in xs]"),
            ("the number of times {a} appears in xs", "xs.count({a})")]


def generate_problem(rng: random.Random, difficulty: int, n_tests: int) -> CodeProblem:
    """A ``solve`` task; tests evaluate the reference expression on random inputs. The prompt's example
    input is never a scored test, so echoing the example earns nothing."""
    if difficulty == 3:
        desc, expr = rng.choice(LIST_OPS)
        a = rng.randint(1, 5)
        desc, expr, arg, kind = desc.format(a=a), expr.format(a=a), "xs", "a non-empty list of integers xs"
        draw = lambda: [rng.randint(-9, 9) for _ in range(rng.randint(1, 6))]  # noqa: E731
    else:
        desc, expr = "x", "x"
        for _ in range(difficulty):
            d, c = rng.choice(INT_OPS)
            a = rng.randint(2, 9)
            inner = expr != "x"
            calls = ("max(", "min(", "abs(")  # a call needs no brackets, inside or around it
            wrap = inner and not c.startswith(calls) and not expr.startswith(calls)
            desc = d.format(e=f"({desc})" if inner else desc, a=a)
            expr = c.format(e=f"({expr})" if wrap else expr, a=a)
        arg, kind = "x", "an integer x"
        draw = lambda: rng.randint(-20, 20)  # noqa: E731
    inputs = [draw() for _ in range(n_tests)]
    shown = draw()
    while shown in inputs:
        shown = draw()
    ref = eval(f"lambda {arg}: {expr}")  # noqa: S307 - our own generated expression, not model text
    tests = tuple(sandbox.Test(call="solve", args=[x], expected=ref(x)) for x in inputs)
    example = f"solve({shown!r}) == {ref(shown)!r}"
    question = f"Write a Python function solve({arg}) that takes {kind} and returns {desc}.\nExample: {example}"
    code = f"def solve({arg}):\n    return {expr}"
    return CodeProblem(question, code, f"solve({arg}) returns {expr}. Check: {example}.", expr, tests)


# ============================================================================ the env

class CodeEnv(SingleTurnEnv):
    """Reward = fraction of tests passed; each test runs in its own sandboxed process."""

    name = "code"
    template_think = TEMPLATE_THINK

    def __init__(self, *, source: str = "generator", path: str | None = None, difficulty: int = 1,
                 n_tests: int = 5, max_tests: int = 10, timeout_s: float = 2.0, cpu_s: int = 1,
                 memory_mb: int = 256, max_procs: int = 8, max_output_kb: int = 64, **common):
        super().__init__(**common)
        if source not in ("generator", "file"):
            raise ValueError(f"code source must be 'generator' or 'file', got {source!r}")
        if difficulty not in (1, 2, 3):
            raise ValueError(f"code difficulty must be 1, 2 or 3, got {difficulty}")
        if source == "file":
            if not path:
                raise ValueError("code source 'file' needs env.code.path (a DeepCoder JSON/JSONL file)")
            load_deepcoder(path, self.val_frac, max_tests)  # fail now, not at the first reset
        problem = sandbox.isolation_problem()
        if problem:
            raise sandbox.SandboxUnavailable(f"the code env runs model-written programs only in the sandbox: {problem}")
        note = sandbox.cgroup_note()
        if note:
            warnings.warn(f"code env sandbox: {note}", stacklevel=2)
        self.source, self.path, self.difficulty = source, path, difficulty
        self.n_tests, self.max_tests = n_tests, max_tests
        # The sandbox's root holds only the interpreter: no data file, copy or project file is readable.
        self.limits = sandbox.Limits(wall_s=timeout_s, cpu_s=cpu_s, memory_mb=memory_mb, max_procs=max_procs,
                                     output_bytes=max_output_kb * 1024)

    def system_prompt(self) -> str:
        return ("You are a Python programmer.\n"
                "Reason briefly in <think>, then put only Python code in <answer>: the function or "
                "program the task asks for, no explanation.\n"
                "Example: <answer>def solve(x):\n    return x</answer>")

    def _problem(self, seed: int, split: str) -> CodeProblem:
        if self.source == "file":
            return pick(load_deepcoder(self.path, self.val_frac, self.max_tests)[split], seed, split, self.path)
        rng = random.Random(seed)
        while True:  # redraw until the task falls in the requested share
            problem = generate_problem(rng, self.difficulty, self.n_tests)
            if split_of(problem.key, self.val_frac) == split:
                return problem

    def _grade(self, answer: str) -> tuple[float, bool, str, dict]:
        t0 = time.perf_counter()
        results = sandbox.run_tests(strip_fence(answer), list(self.problem.tests), self.limits)
        status = {}
        for r in results:
            status[r.status] = status.get(r.status, 0) + 1
        passed, total = status.get("pass", 0), len(results)
        failure = next((r.status for r in results if r.status != "pass"), None)
        detail = next((r.detail for r in results if r.status != "pass"), "")
        verdict = f"{passed}/{total} tests passed." + (f" First failure: {failure} ({detail})." if failure else "")
        info = dict(tests_passed=passed, tests_total=total, test_status=status, failure=failure,
                    sandbox_s=round(time.perf_counter() - t0, 4))
        return passed / max(total, 1), passed == total and total > 0, verdict, info

    def batch_metrics(self, step_infos) -> dict[str, float]:
        return sandbox_metrics(step_infos)

    def _no_answer_info(self) -> dict:
        return dict(tests_passed=0, tests_total=len(self.problem.tests), test_status={}, failure="format",
                    sandbox_s=0.0)


def sandbox_metrics(infos) -> dict[str, float]:
    """Batch metrics from code-env step infos (other envs' infos are skipped; {} when none):
    ``sandbox_<status>`` = share of all executed tests that ended in that status (timeout, memory,
    crash, output_limit, syntax_error, wrong_answer, sandbox_error), ``tests_passed_frac`` = share
    that passed, ``sandbox_s`` = mean sandbox seconds per graded reply."""
    counts: dict[str, int] = {}
    seconds = []
    for info in infos:
        if info.get("test_status") is None or info.get("failure") == "format":
            continue
        seconds.append(info["sandbox_s"])
        for status, n in info["test_status"].items():
            counts[status] = counts.get(status, 0) + n
    if not seconds:
        return {}
    total = max(sum(counts.values()), 1)
    out = {f"sandbox_{s}": counts.get(s, 0) / total for s in sandbox.STATUSES if s != "pass"}
    return out | {"tests_passed_frac": counts.get("pass", 0) / total, "sandbox_s": sum(seconds) / len(seconds)}


def strip_fence(code: str) -> str:
    """The code inside a ```python fence when the answer is fenced, else the answer as written."""
    m = _FENCE.match(code)
    return (m.group(1) if m else code).strip("\n")


# ============================================================================ DeepCoder files

@functools.lru_cache(maxsize=8)
def load_deepcoder(path: str, val_frac: float, max_tests: int) -> dict[str, list[CodeProblem]]:
    """{'train': [...], 'val': [...]} from a DeepCoder-format file; at most ``max_tests`` tests per
    problem (sandbox time grows with them). Rows without usable tests are skipped."""
    out: dict[str, list[CodeProblem]] = {"train": [], "val": []}
    for i, row in enumerate(read_rows(path)):
        text = row.get("problem") or row.get("question") or row.get("prompt")
        if not isinstance(text, str) or "tests" not in row:
            raise ValueError(f"{path}: row {i} needs 'problem' (text) and 'tests' (DeepCoder format), "
                             f"got keys {sorted(row)}")
        meta = _json(row.get("metadata")) or {}
        tests = _tests(_json(row["tests"]), meta.get("func_name") if isinstance(meta, dict) else None)[:max_tests]
        if not tests:
            continue
        func = tests[0].call
        starter = row.get("starter_code") or ""
        ask = (f"Define {func} (a function, or a method of class Solution); it is called with each test's "
               "arguments." if func else "Write a program that reads standard input and prints the answer.")
        question = text.strip() + (f"\nStarter code:\n{starter.strip()}" if starter.strip() else "") + f"\n{ask}"
        solutions = _json(row.get("solutions")) or []
        solution = solutions[0] if isinstance(solutions, list) and solutions and isinstance(solutions[0], str) else "pass"
        out[split_of(text, val_frac)].append(CodeProblem(question, solution, TEMPLATE_THINK, text, tuple(tests)))
    if not out["train"] and not out["val"]:
        raise ValueError(f"{path}: no row has tests this loader understands (stdin or functional)")
    return out


def _json(value):
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return None
    return value


def _tests(raw, func_name: str | None) -> list[sandbox.Test]:
    """DeepCoder's test encodings -> sandbox tests (LiveCodeBench / PrimeIntellect lists, TACO dicts)."""
    if isinstance(raw, dict) and "inputs" in raw and "outputs" in raw:  # TACO
        fn = raw.get("fn_name") or func_name
        raw = [{"input": i, "output": o, "testtype": "functional" if fn else "stdin", "fn_name": fn}
               for i, o in zip(raw["inputs"], raw["outputs"])]
    tests = []
    for t in raw if isinstance(raw, list) else []:
        if not isinstance(t, dict) or "input" not in t or "output" not in t:
            continue
        fn = t.get("fn_name") or (t.get("metadata") or {}).get("func_name") or func_name
        inp, want = t["input"], t["output"]
        if t.get("testtype") == "functional" or t.get("type") == "function_call":
            if not fn:
                continue
            # LiveCodeBench writes one JSON argument per line; TACO a list of arguments.
            args = inp if isinstance(inp, list) else [json.loads(line) for line in str(inp).splitlines() if line.strip()]
            want = _json(want) if isinstance(want, str) else want
            if isinstance(want, list) and len(want) == 1 and isinstance(inp, list):
                want = want[0]  # TACO wraps each return value in a one-element list
            tests.append(sandbox.Test(call=fn, args=args, expected=want))
        else:
            join = lambda v: "\n".join(map(str, v)) if isinstance(v, list) else str(v)  # noqa: E731
            tests.append(sandbox.Test(stdin=join(inp), expected_stdout=join(want)))
    return tests
