"""Sokoban: hand-made rooms with known rewards, slip statistics, generator and expert."""
import math

import pytest

from ragen2_core.envs.base import NO_ACTION_LINE
from ragen2_core.envs.sokoban import ACTIONS, SokobanEnv
from ragen2_core.policy.warmstart import reply_text

ROOM = ["######",
        "#_P__#",
        "#__X_#",
        "#__O_#",
        "#____#",
        "######"]
CORRIDOR = ["######",
            "#P_XO#",
            "######"]
DELTAS = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}
PERPENDICULAR = {"Left": {"Up", "Down"}, "Right": {"Up", "Down"}, "Up": {"Left", "Right"},
                 "Down": {"Left", "Right"}}


def reply(*actions: str) -> str:
    return f"<think>pushing</think><answer>{' || '.join(actions)}</answer>"


def expert_reply(env, style: str = "grounded") -> str:
    turn = env.expert_turn(style)
    return "<think>" + reply_text(turn.think, turn.actions)  # as the warm start writes it


def test_observation_matches_the_documented_format():
    assert SokobanEnv.from_grid(ROOM).render() == (
        "Board size: 6 rows x 6 cols (zero-indexed)\n"
        "Targets: (3, 3)\n"
        "Boxes: (2, 3)\n"
        "Boxes on target: none\n"
        "Player: (1, 2)\n"
        "Grid Map:\n" + "\n".join(ROOM))


def test_from_grid_round_trips_every_symbol():
    board = ["########", "#S√XO_X#", "########"]
    env = SokobanEnv.from_grid(board)
    assert env.render().endswith("\n".join(board))
    assert ("Targets: (1, 1), (1, 2), (1, 4)\nBoxes: (1, 3), (1, 6)\nBoxes on target: (1, 2)\n"
            "Player: (1, 1)") in env.render()


def test_moving_into_a_wall_is_a_costly_no_op():
    env = SokobanEnv.from_grid(CORRIDOR)
    before = env.render()
    result = env.step(reply("Up"))
    assert result.reward == pytest.approx(-0.1) and not result.done
    assert result.observation == before and result.info["actions"] == ["Up"]


def test_pushing_the_box_onto_the_target_solves_the_room():
    env = SokobanEnv.from_grid(CORRIDOR)
    result = env.step(reply("Right", "Right"))
    assert result.reward == pytest.approx(-0.1 + -0.1 + 1 + 10)
    assert result.done and result.success and result.info["terminated_reason"] == "success"
    assert "Boxes: none\nBoxes on target: (1, 4)" in result.observation


def test_pushing_onto_a_target_without_solving_pays_one():
    env = SokobanEnv.from_grid(["#######", "#PXO__#", "#X____#", "#O____#", "#######"])
    result = env.step(reply("Right"))
    assert result.reward == pytest.approx(1 - 0.1) and not result.done


def test_pushing_a_box_off_its_target_costs_one():
    env = SokobanEnv.from_grid(["#######", "#P√___#", "#X____#", "#O____#", "#######"])
    result = env.step(reply("Right"))
    assert result.reward == pytest.approx(-1 - 0.1) and not result.done
    assert "Boxes on target: none" in result.observation


@pytest.mark.parametrize("board", [["######", "#_PX##", "#O___#", "######"],
                                   ["#######", "#PXX_O#", "#O____#", "#######"]])
def test_pushing_a_box_into_a_wall_or_box_is_a_no_op(board):
    env = SokobanEnv.from_grid(board)
    before = env.render()
    result = env.step(reply("Right"))
    assert result.reward == pytest.approx(-0.1) and result.observation == before


def slip_counts(slip: float, n: int) -> tuple[int, int, int]:
    """(intended, perpendicular, other) moves from the centre of an open room."""
    room = ["#######", "#O____#", "#_____#", "#__P__#", "#_____#", "#____X#", "#######"]
    env = SokobanEnv.from_grid(room, slip=slip)
    counts = [0, 0, 0]
    for i in range(n):
        env.reset(0, dynamics_seed=i)
        intended = ACTIONS[i % 4]
        env.step(reply(intended))
        moved = {a for a, (dr, dc) in DELTAS.items() if env.player == (3 + dr, 3 + dc)}
        counts[0 if moved == {intended} else 1 if moved & PERPENDICULAR[intended] else 2] += 1
    return tuple(counts)


def test_slip_replaces_the_move_by_a_perpendicular_one():
    n, p = 4000, 0.8
    intended, perpendicular, other = slip_counts(0.2, n)
    assert abs(intended - n * p) < 4 * math.sqrt(n * p * (1 - p))
    assert other == 0 and intended + perpendicular == n
    assert slip_counts(0.0, 100) == (100, 0, 0) and slip_counts(1.0, 100) == (0, 100, 0)


def test_generator_is_deterministic_solvable_and_short():
    env = SokobanEnv()
    rooms = set()
    for seed in range(200):
        obs = env.reset(seed)
        plan = env.solve()
        assert plan is not None and 1 <= len(plan) <= 10, seed
        assert env.boxes - env.targets, "the box must start off its target"
        assert env.reset(seed) == obs
        rooms.add(obs)
    assert len(rooms) > 150


def test_generator_options():
    env = SokobanEnv(max_solution_len=None, size=7)
    env.reset(3)
    assert env.solve() is not None and env.rows == 7
    with pytest.raises(ValueError):
        SokobanEnv(num_boxes=2)


def test_budget_and_turn_limits():
    env = SokobanEnv.from_grid(ROOM, max_actions=3)
    env.step(reply("Left", "Right"))
    result = env.step(reply("Left", "Right"))
    assert result.done and not result.success and result.info["terminated_reason"] == "budget"
    assert result.info["n_actions_executed"] == 1 and env.actions_left == 0

    env = SokobanEnv.from_grid(ROOM)
    results = [env.step(reply("Left", "Right")) for _ in range(5)]
    assert [r.done for r in results] == [False] * 4 + [True]
    assert results[-1].info["terminated_reason"] == "budget"  # 10 actions and 5 turns at once

    env = SokobanEnv.from_grid(ROOM, max_actions=20)
    assert [env.step(reply("Left")).info["terminated_reason"] for _ in range(5)][-1] == "turns"


def test_invalid_turn_leaves_the_state_unchanged():
    env = SokobanEnv.from_grid(ROOM)
    before = env.render()
    result = env.step("<answer>Down</answer>")
    assert result.reward == pytest.approx(-0.1) and not result.done
    assert result.observation == f"{NO_ACTION_LINE}\n{before}" and env.actions_left == 10


def test_grounded_expert_carries_the_plan():
    env = SokobanEnv.from_grid(ROOM)
    turn = env.expert_turn("grounded")
    assert turn.think == ("Player: (1, 2). Boxes: (2, 3). Targets: (3, 3). "
                          "Plan: Right Down. Next: Right || Down.")
    assert turn.actions == ["Right", "Down"]
    with pytest.raises(ValueError):
        env.expert_turn("nope")


def test_expert_falls_back_in_a_stuck_room():
    env = SokobanEnv.from_grid(["######", "#X_P_#", "#___O#", "######"])
    assert env.solve() is None
    turn = env.expert_turn("grounded")
    assert len(turn.actions) == 1 and "No plan" in turn.think
    assert env.step(expert_reply(env)).info["format_valid"]


def test_expert_solves_every_generated_room_at_slip_zero():
    env = SokobanEnv()
    grounded, template = set(), set()
    for seed in range(100):
        env.reset(seed)
        grounded.add(env.expert_turn("grounded").think)
        template.add(env.expert_turn("template").think)
        while not (result := env.step(expert_reply(env))).done:
            pass
        assert result.success, seed
        assert result.reward > 10
    assert len(template) == 1 and len(grounded) > 50


def test_expert_under_slip_never_raises():
    env = SokobanEnv(slip=0.5)
    for seed in range(30):
        env.reset(seed)
        while not env.step(expert_reply(env)).done:
            assert env.expert_turn("grounded").actions


def test_system_prompt_is_short_and_uses_the_real_budget():
    prompt = SokobanEnv().system_prompt()
    assert "up to 10 actions in total, at most 2 per turn" in prompt.lower()
    assert "<answer>Right || Up</answer>" in prompt and "zero-indexed" in prompt and "push" in prompt
    assert 60 <= len(prompt.split()) <= 90 and len(SokobanEnv(slip=0.3).system_prompt().split()) <= 90


def test_the_release_scale_is_the_default_and_a_config_can_change_it():
    # Two moves solve CORRIDOR: 2 x step + box on target + solved.
    assert SokobanEnv.from_grid(CORRIDOR).step(reply("Right", "Right")).reward == pytest.approx(-0.2 + 1 + 10)
    flat = SokobanEnv.from_grid(CORRIDOR, success_reward=1.0, step_penalty=0.0)
    assert flat.step(reply("Right", "Right")).reward == pytest.approx(0 + 1 + 1)
