"""Code env: reward is the fraction of tests passed in the sandbox; the generator, the DeepCoder
loader (stdin, LiveCodeBench functional, TACO), split disjointness and the step info for metrics."""
import json
import random
from pathlib import Path

import pytest

from ragen2_core.config import load_config
from ragen2_core.envs import sandbox
from ragen2_core.envs.code import CodeEnv, generate_problem, load_deepcoder, sandbox_metrics, strip_fence
from ragen2_core.envs.math import split_of
from ragen2_core.envs.registry import env_factory
from ragen2_core.policy.tokenizer import TAGS, train_tokenizer
from ragen2_core.policy.warmstart import expert_episode, expert_traces

pytestmark = pytest.mark.usefixtures("sandbox")  # fails loudly where programs cannot be sandboxed
DEEPCODER = str(Path(__file__).parents[1] / "fixtures" / "deepcoder_small.jsonl")
VAL = 1_000_000_000


def reply(code: str) -> str:
    return f"<think>writing it</think><answer>{code}</answer>"


def test_correct_solution_scores_one():
    env = CodeEnv(difficulty=2)
    env.reset(4)
    result = env.step(reply(env.problem.answer))
    assert (result.reward, result.done, result.success) == (1.0, True, True)
    assert result.info["test_status"] == {"pass": 5} and result.info["failure"] is None
    assert result.info["tests_passed"] == result.info["tests_total"] == 5


def test_partly_correct_solution_scores_the_fraction():
    env = CodeEnv(difficulty=1, n_tests=6)
    env.reset(2)
    tests = env.problem.tests
    # Right only on non-negative inputs: the reward is exactly the share of such tests.
    program = env.problem.answer.replace("def solve(x):\n", "def solve(x):\n    if x < 0:\n        return 'no'\n")
    expected = sum(t.args[0] >= 0 for t in tests) / len(tests)
    assert 0 < expected < 1  # seed chosen so both kinds occur
    result = env.step(reply(program))
    assert result.reward == pytest.approx(expected) and not result.success
    assert result.info["failure"] == "wrong_answer"
    assert result.info["test_status"] == {"pass": round(expected * 6), "wrong_answer": 6 - round(expected * 6)}


def test_a_hanging_test_costs_only_its_own_share():
    env = CodeEnv(difficulty=1, n_tests=4, timeout_s=1.0)
    env.reset(2)
    first = env.problem.tests[0].args[0]
    hang = env.problem.answer.replace("def solve(x):\n", f"def solve(x):\n    while x == {first}:\n        pass\n")
    result = env.step(reply(hang))
    assert result.info["test_status"].get("timeout", 0) >= 1 and result.info["failure"] == "timeout"
    assert result.reward == pytest.approx(result.info["tests_passed"] / 4) and result.reward >= 0.25


def test_failure_kinds_reach_the_step_info():
    env = CodeEnv(difficulty=1, n_tests=2)
    for program, kind in [("def solve(x) return", "syntax_error"), ("def solve(x):\n    return 1 / 0", "crash"),
                          ("def solve(x):\n    return bytearray(10**10)", "memory")]:
        env.reset(0)
        info = env.step(reply(program)).info
        assert info["failure"] == kind and info["test_status"] == {kind: 2}
    env.reset(0)
    malformed = env.step("def solve(x): return x")
    assert malformed.reward == -0.1 and malformed.info["failure"] == "format" and malformed.info["test_status"] == {}


def test_sandbox_metrics_are_shares_of_executed_tests():
    infos = [dict(test_status={"pass": 3, "timeout": 1}, failure="timeout", sandbox_s=0.2),
             dict(test_status={"crash": 4}, failure="crash", sandbox_s=0.1),
             dict(test_status={}, failure="format", sandbox_s=0.0),   # malformed: nothing ran
             dict(format_valid=True, correct=True)]                    # another env's info
    m = sandbox_metrics(infos)
    assert m["tests_passed_frac"] == 3 / 8 and m["sandbox_timeout"] == 1 / 8 and m["sandbox_crash"] == 4 / 8
    assert m["sandbox_memory"] == 0 and m["sandbox_s"] == pytest.approx(0.15)
    assert sandbox_metrics([dict(correct=True)]) == {}


def test_fenced_answers_are_unwrapped():
    assert strip_fence("```python\ndef f():\n    return 1\n```") == "def f():\n    return 1"
    assert strip_fence("\ndef f():\n    return 1\n") == "def f():\n    return 1"
    env = CodeEnv()
    env.reset(1)
    assert env.step(reply(f"```python\n{env.problem.answer}\n```")).reward == 1.0


@pytest.mark.parametrize("difficulty", [1, 2, 3])
def test_generator_reference_passes_its_own_tests(difficulty):
    problem = generate_problem(random.Random(difficulty), difficulty, 5)
    assert problem == generate_problem(random.Random(difficulty), difficulty, 5)
    assert "Example: solve(" in problem.question and problem.answer.startswith("def solve(")
    assert [r.status for r in sandbox.run_tests(problem.answer, list(problem.tests))] == ["pass"] * 5


def test_generator_split_is_disjoint():
    env = CodeEnv(difficulty=1)
    train = {(env.reset(s), env.problem.key)[1] for s in range(1500)}
    val = {(env.reset(VAL + s), env.problem.key)[1] for s in range(200)}
    assert train and val and not train & val


def test_deepcoder_loader_reads_every_test_encoding():
    splits = load_deepcoder(DEEPCODER, 0.3, 10)
    problems = {p.key.split(".")[0]: p for p in splits["train"] + splits["val"]}
    rows = [json.loads(line) for line in Path(DEEPCODER).read_text().splitlines()]
    assert len(problems) == len(rows) - 1  # the row with unreadable tests is skipped
    total = problems["Read two integers a and b on one line and print their sum"]
    assert [t.stdin for t in total.tests] == ["1 2\n", "10 -4\n", "0 0\n"] and total.tests[0].expected_stdout == "3\n"
    product = problems["Given a list of integers nums, return the largest product of two distinct elements"]
    assert [(t.call, t.args, t.expected) for t in product.tests][0] == ("maxProduct", [[1, 5, 3]], 15)
    assert "class Solution" in product.question and product.answer == "pass"  # no reference solution
    repeat = problems["Return the string s repeated k times"]
    assert [(t.args, t.expected) for t in repeat.tests] == [(["ab", 2], "abab"), (["x", 3], "xxx"), (["", 5], "")]
    reverse = problems["Print the first line of input reversed"]
    assert reverse.tests[1].stdin == "hello\n" and reverse.tests[1].expected_stdout == "olleh\n"


def test_deepcoder_solutions_pass_in_the_env_and_split_is_disjoint():
    splits = load_deepcoder(DEEPCODER, 0.3, 10)
    assert splits["train"] and splits["val"]
    assert not {p.key for p in splits["train"]} & {p.key for p in splits["val"]}
    assert all(split_of(p.key, 0.3) == "val" for p in splits["val"])
    env = CodeEnv(source="file", path=DEEPCODER, val_frac=0.3)
    val_questions = {p.question for p in splits["val"]}
    assert all(env.reset(VAL + s) in val_questions for s in range(20))
    assert all(env.reset(s) not in val_questions for s in range(100))
    solved = 0
    for s in range(len(splits["train"])):
        env.reset(s)
        if env.problem.answer != "pass":
            assert env.step(reply(env.problem.answer)).reward == 1.0
            solved += 1
    assert solved >= 3


def test_leetcode_style_class_solution_is_called():
    env = CodeEnv(source="file", path=DEEPCODER, val_frac=0.3)
    splits = load_deepcoder(DEEPCODER, 0.3, 10)
    split = "train" if any("maxProduct" in p.question for p in splits["train"]) else "val"
    seed = next(i for i, p in enumerate(splits[split]) if "maxProduct" in p.question) + (VAL if split == "val" else 0)
    env.reset(seed)
    program = ("class Solution:\n    def maxProduct(self, nums):\n        a = sorted(nums)\n"
               "        return max(a[0] * a[1], a[-1] * a[-2])")
    assert env.step(reply(program)).reward == 1.0


def test_config_registry_and_expert_trace():
    cfg = load_config(None, ["env.name=code", "env.code.difficulty=3", "env.code.timeout_s=1.5"])
    env = env_factory(cfg.env)()
    assert isinstance(env, CodeEnv) and env.limits.wall_s == 1.5 and env.max_turns == 1
    [(chunk, text)] = expert_episode(env, 5, "grounded")
    env.reset(5)
    assert env.step("<think>" + text).reward == 1.0 and "Check: solve(" in text


def test_tokenizer_round_trips_code():
    cfg = load_config(None, ["warmstart.envs=[code]", "env.code.difficulty=3"])
    texts = [c + r for ep in expert_traces(cfg.warmstart, cfg.env, 60, 0) for c, r in ep]
    tok = train_tokenizer(texts, vocab_size=400)
    odd = "def f(s):\n\tif s >= '0':  # é ✓\n        return {'k': [1, 2]}[s] ** 2 / 3.0\n"
    for text in texts + [odd]:
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    assert all(len(tok.encode(t, add_special_tokens=False)) == 1 for t in TAGS)


@pytest.mark.parametrize("difficulty", [1, 2, 3])
def test_the_prompts_example_is_never_a_scored_test(difficulty):
    for seed in range(40):
        problem = generate_problem(random.Random(seed), difficulty, 5)
        shown = problem.question.split("Example: solve(")[1].rsplit(") == ", 1)
        echo = f"def solve(x):\n    return {shown[1]}"  # returns the example's answer whatever it is given
        assert all(repr(t.args[0]) != shown[0] for t in problem.tests), (seed, shown, problem.tests)
        if seed == 0:  # one reply through the sandbox per difficulty
            env = CodeEnv(difficulty=difficulty)
            env.reset(0)
            env.problem = problem
            assert env.step(reply(echo)).reward == pytest.approx(
                sum(t.expected == eval(shown[1]) for t in problem.tests) / 5)


def test_data_copies_are_unreadable_so_reading_the_answers_earns_nothing(tmp_path):
    # The env trains on a copy of the data set; the project's own copy (tests/fixtures) is elsewhere.
    data = tmp_path / "train.jsonl"
    data.write_text(Path(DEEPCODER).read_text())
    env = CodeEnv(source="file", path=str(data), val_frac=0.3)
    splits = load_deepcoder(str(data), 0.3, 10)
    seed = next(i for i, p in enumerate(splits["train"]) if "print their sum" in p.question)
    env.reset(seed)
    cheat = ("import json, sys\n"
             "given = sys.stdin.read()\n"
             f"for path in [{DEEPCODER!r}, {str(data)!r}]:\n"
             "    try:\n"
             "        rows = [json.loads(line) for line in open(path)]\n"
             "    except OSError:\n"
             "        continue\n"
             "    for row in rows:\n"
             "        for t in json.loads(row['tests']) if isinstance(row['tests'], str) else row['tests']:\n"
             "            if isinstance(t, dict) and t.get('input') == given:\n"
             "                print(t['output'])\n"
             "                sys.exit(0)\n")
    result = env.step(reply(cheat))
    assert result.reward == 0.0 and result.info["test_status"] == {"wrong_answer": 3}
