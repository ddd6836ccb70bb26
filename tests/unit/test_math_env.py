"""Math env: answer normalisation, the generator, the MetaMathQA loader, split disjointness,
single-turn stepping, tokenizer coverage and the warm-start cache key."""
import json
import random
from pathlib import Path

import pytest

from ragen2_core.config import ConfigError, load_config
from ragen2_core.envs.math import MathEnv, generate_problem, load_metamath, normalize_answer, split_of
from ragen2_core.envs.registry import env_factory
from ragen2_core.policy.tokenizer import TAGS, train_tokenizer
from ragen2_core.policy.warmstart import cache_key, expert_episode, expert_traces

FIXTURES = Path(__file__).parents[1] / "fixtures"
METAMATH = str(FIXTURES / "metamathqa_small.jsonl")
VAL = 1_000_000_000  # env.val_seed_start's default


def reply(answer: str, think: str = "working") -> str:
    return f"<think>{think}</think><answer>{answer}</answer>"


@pytest.mark.parametrize("text, canonical", [
    ("3", "3"), (" 3 ", "3"), ("3.0", "3"), ("3/1", "3"), ("+3", "3"), ("03", "3"), ("3.", "3"),
    ("-0", "0"), ("1e3", "1000"), ("1,000", "1000"), ("1,000.50", "2001/2"),
    ("0.5", "1/2"), (".5", "1/2"), ("1/2", "1/2"), ("2 / 4", "1/2"), ("-6/4", "-3/2"),
    ("\\frac{3}{4}", "3/4"), ("\\dfrac{6}{8}", "3/4"), ("$\\boxed{7}$", "7"), ("\\text{ 12 }", "12"),
    ("0.333", "333/1000"),            # exact decimals: not 1/3
    ("Seven.", "seven"), ("  Hello   World ", "hello world"), ("1,2", "1,2"), ("3/0", "3/0"),
])
def test_normalisation_table(text, canonical):
    assert normalize_answer(text) == canonical


def test_equal_answers_compare_equal():
    assert len({normalize_answer(t) for t in ["3", "3.0", "3/1", " 3 ", "\\frac{6}{2}", "$3$"]}) == 1
    assert normalize_answer("0.5") == normalize_answer("1/2") != normalize_answer("0.49")


def test_generator_is_deterministic_and_its_worked_solution_is_right():
    for difficulty in range(1, 6):
        a = generate_problem(random.Random(5), difficulty)
        assert a == generate_problem(random.Random(5), difficulty)
        last = a.solution.rstrip(".").rsplit("= ", 1)[-1]
        assert last == a.answer and a.question.endswith("have now?")
    assert len(generate_problem(random.Random(1), 5).solution.split("=")) == 4  # three steps


def test_step_rewards_correct_wrong_and_malformed():
    env = MathEnv(difficulty=2)
    env.reset(3)
    answer = env.problem.answer
    right = env.step(reply(f"{answer}.0"))
    assert (right.reward, right.done, right.success) == (1.0, True, True)
    assert right.info == dict(format_valid=True, turn=1, terminated_reason="success", answer=answer, correct=True)
    with pytest.raises(RuntimeError):
        env.step(reply(answer))
    env.reset(3)
    wrong = env.step(reply(str(int(answer) + 1)))
    assert (wrong.reward, wrong.done, wrong.success, wrong.info["terminated_reason"]) == (0.0, True, False, "wrong")
    env.reset(3)
    bad = env.step(f"the answer is {answer}")
    assert (bad.reward, bad.done, bad.info["format_valid"]) == (-0.1, True, False)
    env.reset(3)
    assert env.step(reply("  ")).info["format_valid"] is False  # empty answer is malformed too


def test_generator_split_is_disjoint_by_arithmetic():
    env = MathEnv(difficulty=1)
    train = {(env.reset(s), env.problem.key)[1] for s in range(3000)}
    val = {(env.reset(VAL + s), env.problem.key)[1] for s in range(300)}
    assert train and val and not train & val
    assert all(split_of(k, 0.1) == "val" for k in val)


def test_loader_reads_labels_and_skips_unlabelled_rows():
    splits = load_metamath(METAMATH, 0.3)
    problems = splits["train"] + splits["val"]
    rows = [json.loads(line) for line in Path(METAMATH).read_text().splitlines()]
    assert len(problems) == len(rows) - 1  # the row without "The answer is" is skipped
    by_question = {p.question: p for p in problems}
    natalia = by_question[rows[0]["query"]]
    assert natalia.answer == "72" and natalia.solution.endswith("#### 72") and "The answer" not in natalia.solution
    assert by_question[rows[3]["query"]].answer == "\\frac{3}{4}"
    assert normalize_answer(by_question[rows[4]["query"]].answer) == "10"


def test_loader_split_is_disjoint_and_keeps_rephrasings_together():
    splits = load_metamath(METAMATH, 0.3)
    assert splits["train"] and splits["val"]
    train_keys = {p.key for p in splits["train"]}
    assert not train_keys & {p.key for p in splits["val"]}
    assert not {p.question for p in splits["train"]} & {p.question for p in splits["val"]}
    natalia = [p for p in splits["train"] + splits["val"] if "Natalia" in p.question]
    assert len(natalia) == 2 and natalia[0].key == natalia[1].key and len({p.key in train_keys for p in natalia}) == 1


def test_file_env_draws_validation_seeds_from_the_held_out_share():
    env = MathEnv(source="file", path=METAMATH, val_frac=0.3)
    val_questions = {p.question for p in load_metamath(METAMATH, 0.3)["val"]}
    assert all(env.reset(s) not in val_questions for s in range(200))
    assert all(env.reset(VAL + s) in val_questions for s in range(50))
    env.reset(VAL)
    assert env.step(reply(env.problem.answer)).reward == 1.0


def test_json_list_files_load_too():
    splits = load_metamath(str(FIXTURES / "metamathqa_small.json"), 0.5)
    assert len(splits["train"] + splits["val"]) == 5


def test_loader_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        load_metamath(str(tmp_path / "missing.jsonl"), 0.1)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question_text": "x"}) + "\n")
    with pytest.raises(ValueError, match="'query' and 'response'"):
        load_metamath(str(bad), 0.1)
    with pytest.raises(ValueError, match="needs env.math.path"):
        MathEnv(source="file")


def test_config_section_and_registry():
    cfg = load_config(None, ["env.name=math", "env.math.difficulty=3"])
    env = env_factory(cfg.env)()
    assert isinstance(env, MathEnv) and env.difficulty == 3 and env.max_turns == 1 and env.actions_left == 1
    with pytest.raises(ConfigError, match="slip"):
        load_config(None, ["env.name=math", "env.slip=0.1"])
    with pytest.raises(ConfigError, match="env.math.path"):
        load_config(None, ["env.math.source=file"])


def test_expert_episode_is_one_turn_and_earns_the_reward():
    cfg = load_config(None, ["env.name=math", "env.math.difficulty=4"])
    env = env_factory(cfg.env)()
    for style in ("grounded", "template"):
        [(chunk, reply_text)] = expert_episode(env, 11, style)
        assert chunk.endswith("<think>") and "You have 1 actions left" in chunk
        env.reset(11)
        assert env.step("<think>" + reply_text).reward == 1.0


def test_tokenizer_round_trips_math_text_and_keeps_tags_single_tokens():
    cfg = load_config(None, ["warmstart.envs=[math]", "env.math.difficulty=5"])
    texts = [c + r for ep in expert_traces(cfg.warmstart, cfg.env, 60, 0) for c, r in ep]
    tok = train_tokenizer(texts, vocab_size=400)
    extra = ["\\frac{3}{4} = 0.75, 1,000 · π ≈ 3.14159", "-12 / 4 = -3."]
    for text in texts + extra:
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    assert all(len(tok.encode(t, add_special_tokens=False)) == 1 for t in TAGS)


def test_new_env_sections_stay_out_of_the_grid_warm_start_key():
    base = load_config(None)
    changed = load_config(None, ["env.math.difficulty=4", "env.code.timeout_s=5"])
    assert cache_key(base.policy, base.warmstart, base.env) == cache_key(changed.policy, changed.warmstart, changed.env)
    mathy = load_config(None, ["warmstart.envs=[math]"])
    mathy4 = load_config(None, ["warmstart.envs=[math]", "env.math.difficulty=4"])
    assert cache_key(mathy.policy, mathy.warmstart, mathy.env) != cache_key(mathy4.policy, mathy4.warmstart, mathy4.env)
    assert base.warmstart.envs == ["frozenlake", "sokoban"]
