"""Doors env: the chain of unlocked doors is the only way to the goal, the grounded reasoning is
exactly that chain's lookups, locked doors end the episode, sticking doors end the turn."""
import re

import pytest

from ragen2_core.config import ConfigError, load_config
from ragen2_core.envs.doors import ACTIONS, TEMPLATE_THINK, DoorsEnv, room_name
from ragen2_core.envs.registry import env_factory
from ragen2_core.policy.warmstart import cache_key, expert_episode
from ragen2_core.rollout.evaluate import random_baseline


def _reply(actions):
    return f"<think>x</think><answer>{' || '.join(actions)}</answer>"


def _neighbour(env, cell, action):
    dr, dc = {"Left": (0, -1), "Down": (1, 0), "Right": (0, 1), "Up": (-1, 0)}[action]
    return cell[0] + dr, cell[1] + dc


@pytest.mark.parametrize("seed", range(200))
def test_chain_from_start_reaches_goal_in_the_drawn_length_without_revisits(seed):
    env = DoorsEnv(min_path_len=4, max_path_len=8)
    env.reset(seed)
    plan = env.solve()
    assert 4 <= len(plan) <= 8
    cell, seen = env.start, {env.start}
    for action in plan:
        assert env.doors[cell] == action  # the plan is the list's own doors
        cell = _neighbour(env, cell, action)
        assert cell not in seen and all(0 <= x < 4 for x in cell)
        seen.add(cell)
    assert cell == env.goal and env.start != env.goal
    # Every listed door leads to a room inside the grid (a border door would be a way out of nowhere).
    assert len(env.doors) == 16
    assert all(all(0 <= x < 4 for x in _neighbour(env, c, a)) for c, a in env.doors.items())


def test_rooms_are_letters_row_by_row():
    # 4x4: row 0 is A B C D, row 1 starts at E; (2, 3) is 2 * 4 + 3 = 11 letters after A: L.
    assert [room_name((0, c), 4) for c in range(4)] == list("ABCD")
    assert room_name((1, 0), 4) == "E" and room_name((2, 3), 4) == "L" and room_name((4, 4), 5) == "Y"
    with pytest.raises(ValueError, match="one letter per room"):
        DoorsEnv(size=6)


def test_same_seed_same_house_and_the_observation_lists_every_door_with_where_it_leads():
    a, b = DoorsEnv(), DoorsEnv()
    assert a.reset(7) == b.reset(7) and a.doors == b.doors
    obs = a.render()
    listed = re.findall(r"([A-P]) (Left|Down|Right|Up) ([A-P])", obs.split("Doors: ")[1])
    cells = {room_name((r, c), 4): (r, c) for r in range(4) for c in range(4)}
    assert {cells[room]: door for room, door, _ in listed} == a.doors and len(listed) == 16
    assert all(cells[to] == _neighbour(a, cells[room], door) for room, door, to in listed)
    assert f"Player: {room_name(a.start, 4)}\n" in obs and f"Goal: {room_name(a.goal, 4)}\n" in obs


def test_expert_solves_every_house_and_its_reasoning_is_the_chain_of_lookups():
    env = DoorsEnv()
    for seed in range(100):
        turns = expert_episode(env, seed, "grounded")
        assert env.player == env.goal, seed
        env.reset(seed)
        for _, reply in turns:
            think = reply.split("</think>")[0]
            path = think.split("Path: ")[1].split(". Next:")[0].split(" ")
            cell = env.player
            assert path[0] == room_name(cell, 4)
            # Path alternates room, its listed door, the room that door leads to.
            for i in range(1, len(path), 2):
                door = path[i]
                assert door == env.doors[cell]
                cell = _neighbour(env, cell, door)
                assert path[i + 1] == room_name(cell, 4)
            actions = reply.split("<answer>")[1].split("</answer>")[0].split(" || ")
            assert actions == path[1::2]
            env.step("<think>" + reply)


def test_template_reasoning_is_one_sentence_and_acts_like_the_expert():
    env = DoorsEnv()
    env.reset(3)
    grounded, template = env.expert_turn("grounded"), env.expert_turn("template")
    assert template.think == TEMPLATE_THINK and template.actions == grounded.actions


def test_a_locked_door_ends_the_episode_as_a_failure_and_the_right_one_moves():
    env = DoorsEnv()
    env.reset(11)
    right = env.doors[env.start]
    wrong = next(a for a in ACTIONS if a != right)
    result = env.step(_reply([right]))
    assert not result.done and env.player == _neighbour(env, env.start, right)
    env.reset(11)
    result = env.step(_reply([wrong, right]))
    assert result.done and not result.success and result.info["terminated_reason"] == "locked"
    assert result.info["actions"] == [wrong]  # nothing after the locked door
    assert result.reward == 0.0


def test_reaching_the_goal_pays_one_and_ends():
    env = DoorsEnv()
    env.reset(5)
    rewards = []
    plan = env.solve()
    for i in range(0, len(plan), 2):
        result = env.step(_reply(plan[i:i + 2]))
        rewards.append(result.reward)
    assert result.done and result.success and rewards[-1] == 1.0 and sum(rewards) == 1.0


def test_a_sticking_door_keeps_the_player_ends_the_turn_and_spends_the_budget():
    env = DoorsEnv(slip=1.0)  # every door sticks
    env.reset(2)
    plan = env.solve()
    result = env.step(_reply(plan[:2]))
    assert env.player == env.start and not result.done
    assert result.info["actions"] == plan[:1]  # the second move of the turn was not made
    assert env.actions_left == 9
    # At slip 0.5 the stream is the env's own: the same dynamics seed sticks the same doors.
    outs = []
    for _ in range(2):
        e = DoorsEnv(slip=0.5)
        e.reset(4, dynamics_seed=99)
        outs.append([e.step(_reply(e.solve()[:2])).info["actions"] for _ in range(3)])
    assert outs[0] == outs[1]


def test_sticky_doors_lower_success_without_making_it_zero():
    def expert_success(slip, seeds=range(300)):
        wins = 0
        for s in seeds:
            env = DoorsEnv(slip=slip)
            env.reset(s, dynamics_seed=s)
            while True:
                result = env.step(_reply(env.solve()[:2]))
                if result.done:
                    wins += result.success
                    break
        return wins / len(seeds)
    clean, noisy = expert_success(0.0), expert_success(0.5)
    assert clean == 1.0 and 0.05 < noisy < 0.9


def test_random_actions_almost_never_reach_the_goal():
    # Four doors per room, one unlocked, at least four rooms in a row: 1/4 ** 4 = 0.4 % at best.
    assert random_baseline(lambda: DoorsEnv(), seeds=list(range(400)))["success"] < 0.02


def test_config_builds_the_env_and_refuses_impossible_lengths():
    cfg = load_config(None, ["env.name=doors", "env.doors.min_path_len=2", "env.doors.max_path_len=3"])
    env = env_factory(cfg.env)()
    env.reset(0)
    assert 2 <= len(env.solve()) <= 3
    with pytest.raises(ConfigError, match=r"env.doors.max_path_len \(16\) must be below size \* size \(16\)"):
        load_config(None, ["env.doors.max_path_len=16"])
    with pytest.raises(ConfigError, match=r"env.doors.min_path_len \(6\) exceeds max_path_len \(5\)"):
        load_config(None, ["env.doors.min_path_len=6", "env.doors.max_path_len=5"])


def test_doors_settings_stay_out_of_other_policies_cache_keys():
    key = lambda *o: cache_key(*(lambda c: (c.policy, c.warmstart, c.env))(load_config(None, list(o))))  # noqa: E731
    assert key("env.doors.size=5") == key()
    doors = ["env.name=doors", "warmstart.envs=[doors]", "warmstart.init_from=default"]
    assert key(*doors, "env.doors.max_path_len=6") != key(*doors)
    # A continued policy's key depends on the policy it continues.
    assert key(*doors) != key(*doors[:2])


def test_continuing_the_default_policy_needs_its_shape():
    with pytest.raises(ConfigError, match=r"policy.hidden_size is 128, not 64"):
        load_config(None, ["warmstart.init_from=default", "policy.hidden_size=64"])


def test_expert_success_is_the_exact_ceiling_slip_puts_on_success():
    # 3 doors, 2 turns of up to 2 moves, slip 0.5. Turn 1 reaches 2 doors with (1/2)(1/2) = 1/4
    # (then turn 2 needs its first move: 1/2), 1 door with (1/2)(1/2) = 1/4 (turn 2 needs both: 1/4),
    # 0 doors with 1/2 (3 doors in one turn: impossible): 1/4 * 1/2 + 1/4 * 1/4 = 0.1875.
    env = DoorsEnv(size=3, min_path_len=3, max_path_len=3, slip=0.5, max_turns=2, max_actions=4)
    env.reset(0)
    assert len(env.solve()) == 3 and env.expert_success() == pytest.approx(0.1875)
    for slip, want in ((0.0, 1.0), (1.0, 0.0)):
        e = DoorsEnv(slip=slip)
        e.reset(3)
        assert e.expert_success() == want
    # an episode that is over: 1 at the goal, 0 after a locked door
    won = DoorsEnv()
    won.reset(5)
    while not won.step(_reply(won.solve()[:2])).done:
        pass
    lost = DoorsEnv()
    lost.reset(5)
    lost.step(_reply([next(a for a in ACTIONS if a != lost.doors[lost.start])]))
    assert won.expert_success() == 1.0 and lost.expert_success() == 0.0
    # a budget shorter than the path: 0 even without noise (4+ doors, one turn of 2 moves)
    short = DoorsEnv(min_path_len=4, max_path_len=4, max_turns=1)
    short.reset(1)
    assert short.expert_success() == 0.0


def test_expert_success_matches_playing_the_expert():
    # One 3x3 house, slip 0.25, 5 turns: the exact value against 3000 played episodes (dynamics
    # seeds 0..2999); 4 standard errors of a proportion is about 0.03 here.
    probe = DoorsEnv(size=3, min_path_len=5, max_path_len=5, slip=0.25)
    probe.reset(7)
    exact = probe.expert_success()
    wins = 0
    for d in range(3000):
        env = DoorsEnv(size=3, min_path_len=5, max_path_len=5, slip=0.25)
        env.reset(7, dynamics_seed=d)
        while not (result := env.step(_reply(env.solve()[:2]))).done:
            pass
        wins += result.success
    assert 0.3 < exact < 0.99
    assert abs(wins / 3000 - exact) < 4 * (exact * (1 - exact) / 3000) ** 0.5
    # conditional on the state: after a turn whose doors all stuck, less is left
    stuck = DoorsEnv(size=3, min_path_len=5, max_path_len=5, slip=1.0)
    stuck.reset(7)
    stuck.step(_reply(stuck.solve()[:2]))
    stuck.slip = 0.25
    assert stuck.expert_success() < exact


def test_shaped_rewards_pay_per_action_and_at_the_goal():
    """Sokoban's scale on doors: +10 at the goal, -0.1 per action taken. Seed 5's chain walked two
    moves a turn: each full turn pays 2 x -0.1 = -0.2, the last pays -0.1 per move + 10."""
    env = DoorsEnv(success_reward=10.0, step_penalty=-0.1)
    env.reset(5)
    plan = env.solve()
    rewards = [env.step(_reply(plan[i:i + 2])).reward for i in range(0, len(plan), 2)]
    last_moves = len(plan) - 2 * (len(rewards) - 1)
    assert rewards[:-1] == [pytest.approx(-0.2)] * (len(rewards) - 1)
    assert rewards[-1] == pytest.approx(10.0 - 0.1 * last_moves)
    # A locked door costs its step and ends the episode; an unparsable reply costs the format
    # penalty alone (no action is taken). So all-fail groups differ in reward, as in the release.
    env.reset(11)
    wrong = next(a for a in ACTIONS if a != env.doors[env.start])
    assert env.step(_reply([wrong])).reward == pytest.approx(-0.1)
    env.reset(11)
    assert env.step("no tags").reward == pytest.approx(-0.1)
    assert env.step(_reply([env.doors[env.start], wrong])).reward == pytest.approx(-0.2)


def test_shaping_comes_from_the_config_and_is_refused_where_it_means_nothing():
    env = env_factory(load_config("sweeps/base/doors.yaml", ["env.success_reward=10", "env.step_penalty=-0.1"]).env)()
    assert (env.success_reward, env.step_penalty) == (10.0, -0.1)
    default = env_factory(load_config("sweeps/base/doors.yaml").env)()
    assert (default.success_reward, default.step_penalty) == (1.0, 0.0)
    with pytest.raises(ConfigError, match=r"env.step_penalty: 0.1 is out of range; it must be <= 0"):
        load_config("sweeps/base/doors.yaml", ["env.step_penalty=0.1"])
    with pytest.raises(ConfigError, match=r"success_reward \(2.0\) has no meaning for the single-turn env math"):
        load_config(None, ["env.name=math", "env.success_reward=2"])
