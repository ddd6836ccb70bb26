"""FrozenLake: hand-made boards with known answers, slip statistics, generator and expert."""
import math

import pytest

from ragen2_core.envs.base import NO_ACTION_LINE
from ragen2_core.envs.frozenlake import ACTIONS, FrozenLakeEnv
from ragen2_core.policy.warmstart import reply_text

BOARD = ["_P__",
         "_O__",
         "___O",
         "__G_"]
DELTAS = {"Left": (0, -1), "Down": (1, 0), "Right": (0, 1), "Up": (-1, 0)}
PERPENDICULAR = {"Left": {"Up", "Down"}, "Right": {"Up", "Down"}, "Up": {"Left", "Right"},
                 "Down": {"Left", "Right"}}


def reply(*actions: str) -> str:
    return f"<think>moving</think><answer>{' || '.join(actions)}</answer>"


def expert_reply(env, style: str = "grounded") -> str:
    turn = env.expert_turn(style)
    return "<think>" + reply_text(turn.think, turn.actions)  # as the warm start writes it


def test_observation_matches_the_documented_format():
    assert FrozenLakeEnv.from_grid(BOARD).render() == (
        "Board size: 4 rows x 4 cols (zero-indexed)\n"
        "Start: (0, 1)\n"
        "Goal: (3, 2)\n"
        "Player: (0, 1)\n"
        "Holes: (1, 1), (2, 3)\n"
        "Grid Map:\n"
        "_P__\n"
        "_O__\n"
        "___O\n"
        "__G_")


def test_no_holes_and_start_tile_after_leaving():
    env = FrozenLakeEnv.from_grid(["P_", "_G"])
    obs = env.step(reply("Right")).observation
    assert "Holes: none" in obs and "Start: (0, 0)" in obs and obs.endswith("Grid Map:\n_P\n_G")


def test_moving_into_the_border_stays():
    env = FrozenLakeEnv.from_grid(BOARD)
    result = env.step(reply("Up"))
    assert env.player == (0, 1) and result.reward == 0 and not result.done
    assert result.info == dict(format_valid=True, actions=["Up"], n_actions_executed=1, turn=1,
                               terminated_reason=None)


def test_stepping_into_a_hole_ends_without_success():
    env = FrozenLakeEnv.from_grid(BOARD)
    result = env.step(reply("Down", "Down"))
    assert result.done and not result.success and result.reward == 0
    assert result.info["terminated_reason"] == "hole" and result.info["actions"] == ["Down"]
    assert "\n_X__\n" in result.observation
    with pytest.raises(RuntimeError):
        env.step(reply("Up"))


def test_reaching_the_goal_pays_one_and_succeeds():
    env = FrozenLakeEnv.from_grid(["P_G"])
    first = env.step(reply("Right"))
    assert first.reward == 0 and not first.done
    second = env.step(reply("Right"))
    assert second.reward == 1 and second.done and second.success
    assert second.info["terminated_reason"] == "success" and second.observation.endswith("__√")


def slip_counts(slip: float, n: int) -> tuple[int, int, int]:
    """(intended, perpendicular, other) moves from the centre of an open 5x5 lake."""
    env = FrozenLakeEnv.from_grid(["_____", "_____", "__P__", "_____", "____G"], slip=slip)
    counts = [0, 0, 0]
    for i in range(n):
        env.reset(0, dynamics_seed=i)
        intended = ACTIONS[i % 4]
        env.step(reply(intended))
        moved = {a for a, (dr, dc) in DELTAS.items() if env.player == (2 + dr, 2 + dc)}
        counts[0 if moved == {intended} else 1 if moved & PERPENDICULAR[intended] else 2] += 1
    return tuple(counts)


def test_slip_follows_gymnasium_success_rate():
    n, p = 4000, 0.8
    intended, perpendicular, other = slip_counts(0.2, n)
    assert abs(intended - n * p) < 4 * math.sqrt(n * p * (1 - p))
    assert other == 0 and intended + perpendicular == n


def test_slip_extremes():
    assert slip_counts(0.0, 200) == (200, 0, 0)
    assert slip_counts(1.0, 200) == (0, 200, 0)


def test_dynamics_seed_reproduces_slips_without_changing_the_map():
    def trajectory(dynamics_seed):
        env = FrozenLakeEnv(slip=0.5, max_actions=40, max_turns=20)
        obs = env.reset(7, dynamics_seed=dynamics_seed)
        cells = []
        for _ in range(20):
            result = env.step(reply("Right", "Down"))
            cells.append(env.player)
            if result.done:
                break
        return obs, cells

    assert trajectory(1) == trajectory(1)
    runs = [trajectory(d) for d in range(8)]
    assert len({obs for obs, _ in runs}) == 1 and len({tuple(c) for _, c in runs}) > 1


def test_generator_is_deterministic_and_always_solvable():
    env = FrozenLakeEnv()
    maps = set()
    for seed in range(200):
        obs = env.reset(seed)
        plan = env.solve()
        assert plan is not None and len(plan) >= 1, seed
        for action in plan:  # the plan walks only frozen tiles and ends on the goal
            env._apply(action)
            assert env.player not in env.holes
        assert env.player == env.goal
        assert env.reset(seed) == obs
        maps.add(obs)
    assert len(maps) > 150


def test_min_path_len_is_enforced():
    env = FrozenLakeEnv(min_path_len=5)
    for seed in range(50):
        env.reset(seed)
        assert len(env.solve()) >= 5


def test_budget_ends_after_max_actions():
    env = FrozenLakeEnv.from_grid(BOARD, max_actions=3)
    assert not env.step(reply("Left", "Right")).done and env.actions_left == 1
    result = env.step(reply("Left", "Right"))
    assert result.done and not result.success and result.info["n_actions_executed"] == 1
    assert result.info["terminated_reason"] == "budget" and env.actions_left == 0


def test_episode_ends_after_max_turns():
    env = FrozenLakeEnv.from_grid(BOARD, max_actions=100)
    results = [env.step(reply("Left", "Right")) for _ in range(5)]
    assert [r.done for r in results] == [False] * 4 + [True]
    assert results[-1].info["terminated_reason"] == "turns" and results[-1].info["turn"] == 5


def test_invalid_turn_leaves_the_state_unchanged():
    env = FrozenLakeEnv.from_grid(BOARD)
    result = env.step("I go down")
    assert result.reward == pytest.approx(-0.1) and not result.info["format_valid"]
    assert result.observation == f"{NO_ACTION_LINE}\n{env.render()}" and env.player == (0, 1)
    assert env.actions_left == 10


def test_grounded_expert_names_the_position_and_carries_the_path():
    env = FrozenLakeEnv.from_grid(BOARD)
    turn = env.expert_turn("grounded")
    assert turn.think == ("Player: (0, 1). Goal: (3, 2). "
                          "Path: (0, 2) (1, 2) (2, 2) (3, 2). Next: Right || Down.")
    assert turn.actions == ["Right", "Down"]
    with pytest.raises(ValueError):
        env.expert_turn("verbose")


def test_expert_solves_every_generated_map_at_slip_zero():
    env = FrozenLakeEnv()
    grounded, template = set(), set()
    for seed in range(100):
        env.reset(seed)
        grounded.add(env.expert_turn("grounded").think)
        template.add(env.expert_turn("template").think)
        while True:
            result = env.step(expert_reply(env))
            if result.done:
                break
        assert result.success, seed
    assert len(template) == 1 and len(grounded) > 50


def test_expert_under_slip_never_raises():
    env = FrozenLakeEnv(slip=0.5)
    for seed in range(30):
        env.reset(seed)
        done = False
        while not done:
            turn = env.expert_turn("grounded")
            assert 1 <= len(turn.actions) <= min(2, env.actions_left)
            done = env.step(expert_reply(env)).done


def test_system_prompt_is_short_and_uses_the_real_budget():
    calm, slippery = FrozenLakeEnv().system_prompt(), FrozenLakeEnv(slip=0.2).system_prompt()
    assert "slippery" in slippery and "slippery" not in calm
    assert "up to 10 actions in total, at most 2 per turn" in calm.lower()
    assert "<answer>Right || Up</answer>" in calm and "zero-indexed" in calm
    assert 60 <= len(calm.split()) <= 90 and len(slippery.split()) <= 90
    assert "up to 7 actions in total, at most 3 per turn" in FrozenLakeEnv(
        max_actions=7, max_actions_per_turn=3).system_prompt().lower()


def test_scan_expert_writes_each_moves_cell_and_distance():
    # Distances to G (3, 2) avoiding holes (1, 1), (2, 3), by hand: (0, 0) 5, (0, 1) 4, (0, 2) 3,
    # (0, 3) 4, (1, 2) 2. From (0, 1) Up hits the border (listed nowhere); the only cell one closer
    # is (0, 2), so Right; from (0, 2) it is (1, 2), so Down.
    env = FrozenLakeEnv.from_grid(BOARD, scratchpad="scan")
    turn = env.expert_turn("grounded")
    assert turn.think == ("At (0, 1): Left (0, 0) d5, Down (1, 1) hole, Right (0, 2) d3. "
                          "At (0, 2): Left (0, 1) d4, Down (1, 2) d2, Right (0, 3) d4. "
                          "Next: Right || Down.")
    assert turn.actions == ["Right", "Down"]
    assert env.expert_turn("template").actions == ["Right", "Down"]


def test_scan_expert_is_as_short_as_bfs_and_always_solves():
    scan, path = FrozenLakeEnv(scratchpad="scan"), FrozenLakeEnv()
    for seed in range(100):
        scan.reset(seed)
        path.reset(seed)
        assert len(scan.solve()) == len(path.solve()), seed
        while True:
            result = scan.step(expert_reply(scan))
            if result.done:
                break
        assert result.success, seed


def test_scratchpad_must_be_known():
    with pytest.raises(ValueError, match="scratchpad"):
        FrozenLakeEnv(scratchpad="essay")


def test_shaped_rewards_on_the_lake():
    # P_G: two moves right, -0.05 each, +3 at the goal.
    env = FrozenLakeEnv.from_grid(["P_G"], success_reward=3.0, step_penalty=-0.05)
    assert env.step(reply("Right")).reward == pytest.approx(-0.05)
    assert env.step(reply("Right")).reward == pytest.approx(3.0 - 0.05)
