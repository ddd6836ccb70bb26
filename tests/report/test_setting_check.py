"""ragen2 setting-check's teacher-forced reading, with stand-in models whose every prediction is
known: one that always predicts the episode's next token, and one that gets one token wrong."""
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from ragen2_core.envs.doors import DoorsEnv
from ragen2_core.policy.warmstart import SHIPPED, expert_episode
from ragen2_core.report import setting_check
from ragen2_core.rollout.prompt import RAW

TOKENIZER = next(SHIPPED.glob("embedded-*"), None)
pytestmark = pytest.mark.skipif(TOKENIZER is None, reason="no shipped policy folder to take a tokenizer from")


class Oracle(torch.nn.Module):
    """Logits that put all mass on the true next token, except where ``wrong`` says (positions whose
    *target* token index is in it get the token after the true one)."""

    def __init__(self, vocab: int, wrong=()):
        super().__init__()
        self.vocab, self.wrong = vocab, set(wrong)

    def forward(self, input_ids):
        ids = input_ids[0].tolist()
        logits = torch.zeros(1, len(ids), self.vocab)
        for t in range(len(ids) - 1):
            target = ids[t + 1] if t + 1 not in self.wrong else (ids[t + 1] + 1) % self.vocab
            logits[0, t, target] = 1.0
        return type("Out", (), {"logits": logits})()


def _replies(tok, seed, style):
    """(index of the reply's first token in the episode, reply text, its encoding) per turn."""
    n, replies = 0, []
    for chunk, reply in expert_episode(DoorsEnv(), seed, style, RAW):
        n += len(tok.encode(chunk, add_special_tokens=False))
        replies.append((n, reply, tok(reply, add_special_tokens=False, return_offsets_mapping=True)))
        n += len(replies[-1][2]["input_ids"])
    return replies


def test_a_model_that_is_always_right_scores_one_everywhere():
    tok = AutoTokenizer.from_pretrained(TOKENIZER)
    out = setting_check.teacher_forced(Oracle(len(tok)), tok, DoorsEnv, [0, 1], "grounded", RAW)
    # Seeds 0 and 1 need 2-4 turns each; every turn is right, and every answer has 1 or 2 moves.
    turns = sum(len(expert_episode(DoorsEnv(), s, "grounded", RAW)) for s in (0, 1))
    assert out["turns"] == turns and out["reply_right"] == 1.0
    assert out["move_right"]["1"] == 1.0 and out["move_right"].get("2", 1.0) == 1.0


def test_one_wrong_token_in_the_first_answers_second_move_counts_against_that_move_and_reply_only():
    tok = AutoTokenizer.from_pretrained(TOKENIZER)
    replies = _replies(tok, 0, "template")
    base, reply, enc = replies[0]
    second = reply.index(" || ") + len(" || ")  # first character of the second move
    # The token of the first reply whose characters start the second move.
    t = base + next(j for j, (a, b) in enumerate(enc["offset_mapping"]) if a <= second < b)
    out = setting_check.teacher_forced(Oracle(len(tok), wrong=[t]), tok, DoorsEnv, [0], "template", RAW)
    n = len(replies)
    # One of n replies is wrong; all first moves are right; one of the second moves is wrong.
    n_second = sum(" || " in r for _, r, _ in replies)
    assert out["turns"] == n and out["reply_right"] == pytest.approx((n - 1) / n)
    assert out["move_right"]["1"] == 1.0
    assert out["move_right"]["2"] == pytest.approx((n_second - 1) / n_second)


def test_one_style_policies_share_the_curriculum_stage_and_its_steps():
    from ragen2_core.config import load_config
    from ragen2_core.policy.warmstart import cache_key, grounded_stage

    doors = str(Path(__file__).resolve().parents[2] / "sweeps/base/doors.yaml")
    cfg = load_config(doors)
    assert cfg.warmstart.grounded_steps > 0  # the shipped setting is a curriculum
    variants = {name: load_config(doors, extra) for name, extra in setting_check.variant_overrides(cfg).items()}
    keys = {name: cache_key(c.policy, c.warmstart, c.env) for name, c in variants.items()}
    # grounded_only is the mixed policy's first stage (built once, read twice) ...
    assert keys["grounded_only"] == cache_key(cfg.policy, grounded_stage(cfg.warmstart), cfg.env)
    assert keys["mixed"] == cache_key(cfg.policy, cfg.warmstart, cfg.env)
    # ... and template_only gets as many steps on its own traces.
    g, t = variants["grounded_only"].warmstart, variants["template_only"].warmstart
    assert (g.grounded_frac, t.grounded_frac) == (1.0, 0.0)
    assert g.steps == t.steps == cfg.warmstart.grounded_steps and g.grounded_steps == t.grounded_steps == 0
    # Without a curriculum the three differ in grounded_frac only.
    plain = load_config(doors, ["warmstart.grounded_steps=0"])
    assert setting_check.variant_overrides(plain)["template_only"] == [
        "warmstart.grounded_frac=0.0", "warmstart.grounded_steps=0", f"warmstart.steps={plain.warmstart.steps}"]


def _expert_reply(env, think=None):
    turn = env.expert_turn("grounded")
    return f"<think>{think or turn.think}</think><answer>{' || '.join(turn.actions)}</answer>"


def test_state_reading_splits_turns_by_whether_a_door_stuck():
    make = lambda: DoorsEnv(size=3, min_path_len=5, max_path_len=5, slip=1.0)  # noqa: E731 (every door sticks)
    env = make()
    env.reset(7, dynamics_seed=7)
    here = env.expert_turn("grounded").think.split(". ")[0]  # "Player: X"
    wrong = "Player: A" if here != "Player: A" else "Player: B"
    replies = [_expert_reply(env),                                      # first turn, read right
               _expert_reply(env),                                      # stuck: same state, read right
               _expert_reply(env, env.expert_turn("grounded").think.replace(here, wrong)),  # stuck, misread
               f"<think>{env.template_think}</think><answer>Up</answer>"]  # template: not a reading
    out = setting_check.state_reading(make, [7], [replies])
    assert out == {"first turn": {"right": 1, "turns": 1}, "state repeated": {"right": 1, "turns": 2}}
    # without noise the expert moves every turn and reads every state right
    clean = lambda: DoorsEnv(size=3, min_path_len=5, max_path_len=5)  # noqa: E731
    env = clean()
    env.reset(7, dynamics_seed=7)
    played = []
    while True:
        played.append(_expert_reply(env))
        if env.step(played[-1]).done:
            break
    # 5 doors at 2 a turn: 3 turns
    assert setting_check.state_reading(clean, [7], [played]) == {"first turn": {"right": 1, "turns": 1},
                                                                 "after a move": {"right": 2, "turns": 2}}


def test_expert_ceiling_and_the_reading_table():
    seeds = list(range(5))
    assert setting_check.expert_ceiling(lambda: DoorsEnv(size=3, min_path_len=3, max_path_len=5), seeds) == 1.0
    noisy = setting_check.expert_ceiling(lambda: DoorsEnv(size=3, min_path_len=3, max_path_len=5, slip=0.5), seeds)
    each = []
    for s in seeds:
        env = DoorsEnv(size=3, min_path_len=3, max_path_len=5, slip=0.5)
        env.reset(s)
        each.append(env.expert_success())
    assert noisy == pytest.approx(sum(each) / 5) and 0 < noisy < 1
    from ragen2_core.envs.frozenlake import FrozenLakeEnv
    assert setting_check.expert_ceiling(lambda: FrozenLakeEnv(), seeds) is None  # not computed there
    row = setting_check.reading_table({"mixed": {"successes": 30, "episodes": 100, "expert_ceiling": 0.929,
                                                 "state_read": {"first turn": {"right": 9, "turns": 10}}}})
    # 30 of 100: Wilson [21.9, 39.6]; 9 of 10: [59.6, 98.2]; no turn of the other kinds: a dash
    assert "| mixed | 30.0 [21.9, 39.6] | 92.9 | 90.0 [59.6, 98.2] of 10 | – | – |" in row


def test_the_comparison_table_shows_what_the_played_policies_allow():
    mixed = {"successes": 50, "episodes": 100, "template_frac": 0.5,
             "first_turn": {"grounded": {"successes": 30, "episodes": 50},
                            "template": {"successes": 20, "episodes": 50}}}
    alone = setting_check.table({"mixed": mixed})  # --only mixed: (a) only
    # 30 of 50 vs 20 of 50: 60 % vs 40 %, a difference of 20 points
    assert "| mixed policy: grounded first turn (50) vs template first turn (50) | 60.0" in alone
    assert "| 20.0 [" in alone and "grounded-only vs template-only" not in alone
    one_style = {"successes": 10, "episodes": 100, "template_frac": 0.0}
    both = setting_check.table({"grounded_only": one_style, "template_only": one_style})
    assert "| grounded-only vs template-only warm start | 10.0" in both and "| 0.0 [" in both
    assert "mixed policy" not in both
