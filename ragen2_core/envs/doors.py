"""Doors: rooms on a grid, each with one unlocked door, all listed in the observation.

The player must reach the goal room. Rooms are named by letters, row by row (A B C D on the top
row of a 4x4 house). Every room has exactly one unlocked door (a move: Left, Down, Right, Up) and
the observation lists each with the room it leads to (``Doors: A Down E, B Left A, ...``). Trying a
locked door ends the episode, so the only way to the goal is the chain of unlocked doors from the
start, several rooms long. The chain is a random self-avoiding walk, not a shortest path: no
geometric rule ("head for the goal") finds it, only reading the list does.

Each step of the chain is one lookup whose key is one letter, the room just written (find ``C``
in the list, copy the door and the room after it): an induction-style copy, which the embedded
model learns in a grounded doors warm start on a 3x3 house (docs/reproduction.md). The grounded
reasoning writes those steps down (``Path: B Right C Down G``). Answering without it means
composing two lookups in one forward pass for every second move of a turn, which a ~1M-parameter
model is not expected to do reliably; whether the reasoning is then needed, so that a collapse to
the template costs success, is what ``reports/setting_check.py`` measures.

Noise (``slip``): with that probability a door sticks, the player stays, and the rest of the
turn's moves are not made (the budget is spent), so noise lowers success without making it zero.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from .base import MOVES, TURN_OVER, TextEnv

Pos = tuple[int, int]

TEMPLATE_THINK = "Let me think about the doors that lead to the goal."
ACTIONS = ["Left", "Down", "Right", "Up"]
_DYNAMICS_SALT = 0xD0_025  # keeps the sticking-door stream apart from the map stream of the same seed
_MAX_ATTEMPTS = 10_000


MAX_SIZE = 5  # one capital letter per room


def room_name(cell: Pos, size: int) -> str:
    """Rooms are named A, B, C, ... row by row: a lookup's key is one letter."""
    return chr(ord("A") + cell[0] * size + cell[1])


class DoorsEnv(TextEnv):
    """Follow the unlocked doors from the start to the goal; reward 1 at the goal, 0 otherwise (by default)."""

    name = "doors"
    template_think = TEMPLATE_THINK
    action_names = ACTIONS

    def __init__(self, *, slip: float = 0.0, max_turns: int = 5, max_actions_per_turn: int = 2,
                 max_actions: int = 10, format_penalty: float = -0.1,
                 success_reward: float | None = None, step_penalty: float | None = None, size: int = 4,
                 min_path_len: int = 4, max_path_len: int = 8):
        super().__init__(slip=slip, max_turns=max_turns, max_actions_per_turn=max_actions_per_turn,
                         max_actions=max_actions, format_penalty=format_penalty,
                         success_reward=success_reward, step_penalty=step_penalty)
        if not 0.0 <= slip <= 1.0:
            raise ValueError(f"slip must be in [0, 1], got {slip}")
        if not 2 <= size <= MAX_SIZE:
            raise ValueError(f"size must be in [2, {MAX_SIZE}] (one letter per room), got {size}")
        if not 1 <= min_path_len <= max_path_len < size * size:
            raise ValueError(f"need 1 <= min_path_len ({min_path_len}) <= max_path_len ({max_path_len}) "
                             f"< size * size ({size * size})")
        self.size, self.min_path_len, self.max_path_len = size, min_path_len, max_path_len
        self.doors: dict[Pos, str] = {}
        self.start: Pos = (0, 0)
        self.goal: Pos = (0, 0)
        self._player: Pos = (0, 0)
        self._dyn: np.random.Generator | None = None

    # ---- map -------------------------------------------------------------------------------

    def _generate(self, rng: np.random.Generator) -> None:
        n = self.size
        for _ in range(_MAX_ATTEMPTS):
            length = int(rng.integers(self.min_path_len, self.max_path_len + 1))
            pos = (int(rng.integers(n)), int(rng.integers(n)))
            walk, seen = [], {pos}
            while len(walk) < length:
                options = [a for a in ACTIONS if (nxt := self._move(pos, a)) != pos and nxt not in seen]
                if not options:
                    break
                action = options[int(rng.integers(len(options)))]
                walk.append((pos, action))
                pos = self._move(pos, action)
                seen.add(pos)
            if len(walk) < length:
                continue  # the walk boxed itself in: draw another
            doors = {}
            for r in range(n):
                for c in range(n):
                    inside = [a for a in ACTIONS if self._move((r, c), a) != (r, c)]
                    doors[(r, c)] = inside[int(rng.integers(len(inside)))]
            doors.update(dict(walk))
            self.doors, self.start, self.goal = doors, walk[0][0], pos
            return
        raise RuntimeError(f"no self-avoiding walk of {self.min_path_len}-{self.max_path_len} doors on a "
                           f"{n}x{n} grid in {_MAX_ATTEMPTS} tries")

    def _move(self, pos: Pos, action: str) -> Pos:
        dr, dc = MOVES[action]
        r, c = pos[0] + dr, pos[1] + dc
        return (r, c) if 0 <= r < self.size and 0 <= c < self.size else pos

    # ---- episode ---------------------------------------------------------------------------

    def reset(self, seed: int, dynamics_seed: int | None = None) -> str:
        self._generate(np.random.default_rng(seed))
        self._dyn = np.random.default_rng([_DYNAMICS_SALT, seed if dynamics_seed is None else dynamics_seed])
        self._player = self.start
        self._turn, self._n_actions, self._done = 0, 0, False
        return self.render()

    @property
    def player(self) -> Pos:
        return self._player

    def _apply(self, action: str) -> tuple[float, str | None]:
        if self.slip and self._dyn.random() < self.slip:
            return 0.0, TURN_OVER  # the door sticks
        if action != self.doors[self._player]:
            return 0.0, "locked"
        self._player = self._move(self._player, action)
        return 0.0, "success" if self._player == self.goal else None

    # ---- text ------------------------------------------------------------------------------

    def room(self, cell: Pos) -> str:
        return room_name(cell, self.size)

    def render(self) -> str:
        doors = ", ".join(f"{self.room(c)} {self.doors[c]} {self.room(self._move(c, self.doors[c]))}"
                          for c in sorted(self.doors))
        last = self.room((self.size - 1, self.size - 1))
        return "\n".join([f"Rooms: A-{last}, {self.size} rows x {self.size} cols, named row by row",
                          f"Goal: {self.room(self.goal)}", f"Player: {self.room(self._player)}",
                          f"Doors: {doors}"])

    def system_prompt(self) -> str:
        k = self.max_actions_per_turn
        sticky = " A door may stick: you stay, and the rest of that turn's moves are lost." if self.slip > 0 else ""
        return (
            "You are in a house of rooms on a grid.\n"
            "Goal: reach the goal room. Each room has one unlocked door, listed under Doors with "
            f"the room it leads to; trying a locked door ends the game.{sticky}\n"
            f"Actions: {', '.join(ACTIONS)}: go through the door on that side.\n"
            f"Up to {self.max_actions} actions in total, at most {k} per turn, separated by ||.\n"
            f"Example: <answer>{' || '.join(['Right', 'Up'][:k])}</answer>")

    # ---- expert ----------------------------------------------------------------------------

    def solve(self) -> list[str] | None:
        """The unlocked doors from the player to the goal (the only way there)."""
        plan, pos, seen = [], self._player, {self._player}
        while pos != self.goal:
            action = self.doors[pos]
            pos = self._move(pos, action)
            if pos in seen:
                return None  # not on the chain (cannot happen from the start)
            plan.append(action)
            seen.add(pos)
        return plan

    def expert_success(self) -> float:
        """The chance that the expert, replanning every turn, reaches the goal from here within the
        turns and actions left: the ceiling ``slip`` puts on any policy's success (1 at slip 0 when
        the budget covers the path). Exact, over the ways the doors can stick."""
        if self._done:  # the episode is over: it either reached the goal or did not
            return float(self._player == self.goal)
        plan = self.solve()
        if plan is None:
            return 0.0
        s, k = self.slip, self.max_actions_per_turn

        @lru_cache(maxsize=None)
        def reach(turns: int, actions: int, doors: int) -> float:
            if doors == 0:
                return 1.0
            if turns == 0 or actions == 0:
                return 0.0
            tries = min(k, actions, doors)
            p, through = 0.0, 1.0  # through: every try so far went through its door
            for i in range(tries):  # try i sticks: i doors passed, i + 1 actions spent, turn over
                p += through * s * reach(turns - 1, actions - i - 1, doors - i)
                through *= 1 - s
            return p + through * reach(turns - 1, actions - tries, doors - tries)

        return reach(self.max_turns - self._turn, self.actions_left, len(plan))

    def _grounded_think(self, plan: list[str] | None, next_actions: str) -> str:
        here = f"Player: {self.room(self._player)}. Goal: {self.room(self.goal)}."
        if plan is None:
            return f"{here} No path. Next: {next_actions}."
        steps, pos = [self.room(self._player)], self._player
        for action in plan[:next_actions.count("||") + 1]:
            pos = self._move(pos, action)
            steps += [action, self.room(pos)]
        return f"{here} Path: {' '.join(steps)}. Next: {next_actions}."

    def _fallback_move(self) -> list[str]:
        return [self.doors[self._player]]
