"""The shared reply parser, how both envs penalise a bad reply, and the env registry."""
import pytest

from ragen2_core.envs.base import parse_response
from ragen2_core.envs.frozenlake import FrozenLakeEnv
from ragen2_core.envs.registry import ENV_NAMES, make_env
from ragen2_core.envs.sokoban import SokobanEnv

NAMES = ["Up", "Down", "Left", "Right"]


def parse(text: str):
    return parse_response(text, NAMES, 2)


def test_well_formed_reply():
    p = parse("<think>go up</think><answer>Up || Left</answer>")
    assert (p.think, p.actions, p.format_valid, p.n_requested) == ("go up", ["Up", "Left"], True, 2)


@pytest.mark.parametrize("text", ["Up || Left", "<answer>Up</answer>", "<think>x</think> Up",
                                  "<think>x<answer>Up</answer>", "<answer>Up</answer><think>x</think>"])
def test_missing_or_misplaced_tags_give_no_action(text):
    p = parse(text)
    assert (p.think, p.actions, p.format_valid, p.n_requested) == (None, [], False, 0)


def test_three_actions_are_truncated_without_penalty():
    p = parse("<think></think><answer>Up || Up || Left</answer>")
    assert p.actions == ["Up", "Up"] and p.format_valid and p.n_requested == 3


def test_unknown_action_is_dropped_and_invalidates_the_turn():
    p = parse("<think></think><answer>Up || Jump || Left</answer>")
    assert p.actions == ["Up", "Left"] and not p.format_valid and p.n_requested == 3


def test_case_insensitive_and_whitespace_tolerant():
    p = parse("<think> a </think>\n  <answer>  up ||LEFT   </answer>")
    assert p.actions == ["Up", "Left"] and p.format_valid and p.think == "a"


def test_newline_inside_think():
    p = parse("<think>first line\nsecond line</think><answer>Down</answer>")
    assert p.think == "first line\nsecond line" and p.actions == ["Down"] and p.format_valid


@pytest.mark.parametrize("answer", ["", "   ", "||", " || "])
def test_empty_answer_is_invalid(answer):
    p = parse(f"<think>hmm</think><answer>{answer}</answer>")
    assert p.actions == [] and not p.format_valid and p.think == "hmm"


ENVS = [lambda **kw: FrozenLakeEnv.from_grid(["_P__", "____", "____", "__G_"], **kw),
        lambda **kw: SokobanEnv.from_grid(["######", "#_P__#", "#__X_#", "#__O_#", "#____#", "######"], **kw)]


def first_step(make, text: str):
    return make().step(text)


@pytest.mark.parametrize("make", ENVS)
def test_envs_penalise_an_unknown_action_once_and_still_move(make):
    clean = first_step(make, "<think></think><answer>Left</answer>")
    mixed = first_step(make, "<think></think><answer>Left || Jump</answer>")
    assert mixed.reward == pytest.approx(clean.reward - 0.1)
    assert mixed.observation == clean.observation and mixed.info["actions"] == ["Left"]
    assert not mixed.info["format_valid"] and clean.info["format_valid"]


@pytest.mark.parametrize("make", ENVS)
def test_envs_truncate_extra_actions_without_penalty(make):
    result = first_step(make, "<think></think><answer>Left || Left || Left</answer>")
    assert result.info["actions"] == ["Left", "Left"] and result.info["format_valid"]
    assert result.reward == pytest.approx(0.0 if isinstance(make(), FrozenLakeEnv) else -0.2)


@pytest.mark.parametrize("make", ENVS)
@pytest.mark.parametrize("text", ["", "Left", "<think>x</think><answer></answer>",
                                  "<think>x</think><answer>Jump</answer>"])
def test_envs_treat_a_reply_without_valid_action_as_a_no_op(make, text):
    env = make(format_penalty=-0.25)
    before = env.render()
    result = env.step(text)
    assert result.reward == pytest.approx(-0.25) and not result.done
    assert result.observation.splitlines()[0] == "No valid action was given; the state is unchanged."
    assert result.observation.split("\n", 1)[1] == before
    assert result.info["n_actions_executed"] == 0 and env.actions_left == 10


def test_registry_builds_each_env_with_kwargs():
    assert list(ENV_NAMES) == ["frozenlake", "sokoban", "math", "code", "doors"]
    lake = make_env("frozenlake", slip=0.2, size=5)
    room = make_env("sokoban", max_actions=6)
    assert isinstance(lake, FrozenLakeEnv) and lake.size == 5 and lake.slip == 0.2
    assert isinstance(room, SokobanEnv) and room.max_actions == 6
    for name in ENV_NAMES:
        env = make_env(name)
        assert env.name == name and env.reset(1) == make_env(name).reset(1)


def test_registry_rejects_an_unknown_name():
    with pytest.raises(ValueError, match=r"'maze'.*frozenlake, sokoban"):
        make_env("maze")
