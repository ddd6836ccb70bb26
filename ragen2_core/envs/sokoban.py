"""Sokoban as a multi-turn text env.

Rooms are generated the gym-sokoban way: carve the floor by a random walk, put the box on its
target, then play backwards (the player pulls the box) and start from the reachable state whose box
lies farthest from the target. A forward BFS then confirms the room is solvable, and short enough.
Slip: with probability ``slip`` a move is replaced by one of the two perpendicular moves, evenly.
"""
from __future__ import annotations

from collections import deque

import numpy as np

from .base import MOVES, TextEnv

Pos = tuple[int, int]
Boxes = frozenset[Pos]

TEMPLATE_THINK = "Let me think about the moves that push the box onto the target."
ACTIONS = ["Up", "Down", "Left", "Right"]
_DIRECTIONS = [MOVES[a] for a in ACTIONS]  # in ACTIONS' order: rooms are drawn by index
_PERPENDICULAR = {"Up": ("Left", "Right"), "Down": ("Left", "Right"),
                  "Left": ("Up", "Down"), "Right": ("Up", "Down")}
BOX_ON_REWARD, BOX_OFF_REWARD = 1.0, -1.0  # the release's; its -0.1 a step and +10 solved are the class's scale
# Keeps the slip stream independent of the map stream when both come from the same seed.
_DYNAMICS_SALT = 0x50_C0
_MAX_ATTEMPTS = 1000
# gym-sokoban's random-walk brushes: each step carves one of these 3x3 patterns.
_MASKS = [np.array(m, dtype=bool) for m in (
    [[0, 0, 0], [1, 1, 1], [0, 0, 0]], [[0, 1, 0], [0, 1, 0], [0, 1, 0]],
    [[0, 0, 0], [1, 1, 0], [0, 1, 0]], [[0, 0, 0], [1, 1, 0], [1, 1, 0]],
    [[0, 0, 0], [0, 1, 1], [0, 1, 0]])]


def _fmt(cells) -> str:
    return ", ".join(f"({r}, {c})" for r, c in sorted(cells)) if cells else "none"


def _add(pos: Pos, d: Pos) -> Pos:
    return pos[0] + d[0], pos[1] + d[1]


def _move(floor: frozenset[Pos], player: Pos, boxes: Boxes, action: str) -> tuple[Pos, Boxes, Pos | None]:
    """One forward move -> (player, boxes, box destination if a box was pushed). Blocked moves
    (into a wall, or pushing a box into a wall or another box) leave everything in place."""
    d = MOVES[action]
    nxt = _add(player, d)
    if nxt not in floor:
        return player, boxes, None
    if nxt not in boxes:
        return nxt, boxes, None
    beyond = _add(nxt, d)
    if beyond not in floor or beyond in boxes:
        return player, boxes, None
    return nxt, (boxes - {nxt}) | {beyond}, beyond


def solve(floor: frozenset[Pos], targets: frozenset[Pos], player: Pos, boxes: Boxes,
          ) -> list[str] | None:
    """Shortest action list putting every box on a target (ties: Up, Down, Left, Right)."""
    start = (player, boxes)
    parent: dict[tuple[Pos, Boxes], tuple | None] = {start: None}
    queue = deque([start])
    while queue:
        state = queue.popleft()
        if state[1] <= targets:
            plan = []
            while parent[state] is not None:
                state, action = parent[state]
                plan.append(action)
            return plan[::-1]
        for action in ACTIONS:
            p, b, _ = _move(floor, *state, action)
            if (p, b) not in parent:
                parent[(p, b)] = (state, action)
                queue.append((p, b))
    return None


class SokobanEnv(TextEnv):
    """Push the box onto the target: -0.1 per move, +1 / -1 box on / off target, +10 solved."""

    name = "sokoban"
    template_think = TEMPLATE_THINK
    action_names = ACTIONS
    success_reward, step_penalty = 10.0, -0.1

    def __init__(self, *, slip: float = 0.0, max_turns: int = 5, max_actions_per_turn: int = 2,
                 max_actions: int = 10, format_penalty: float = -0.1,
                 success_reward: float | None = None, step_penalty: float | None = None, size: int = 6, num_boxes: int = 1,
                 search_depth: int = 300, max_solution_len: int | None = 10):
        super().__init__(slip=slip, max_turns=max_turns, max_actions_per_turn=max_actions_per_turn,
                         max_actions=max_actions, format_penalty=format_penalty,
                         success_reward=success_reward, step_penalty=step_penalty)
        if not 0.0 <= slip <= 1.0:
            raise ValueError(f"slip must be in [0, 1], got {slip}")
        if num_boxes != 1:
            raise ValueError(f"num_boxes must be 1 (the only count the generator supports), got {num_boxes}")
        if size < 4:
            raise ValueError(f"size must be >= 4, got {size}")
        self.size, self.num_boxes = size, num_boxes
        self.search_depth, self.max_solution_len = search_depth, max_solution_len
        self._fixed: tuple | None = None  # set by from_grid: reset() then reuses this board

    @classmethod
    def from_grid(cls, lines: list[str], **kwargs) -> SokobanEnv:
        """An env on a fixed board drawn with the observation symbols (any number of boxes, as many
        targets), already reset with seed 0; later resets keep the board and only reseed the slip."""
        if len({len(row) for row in lines}) != 1 or any(set(row) - set("#_OX√PS") for row in lines):
            raise ValueError(f"bad board {lines!r}: rows of equal length using only # _ O X √ P S")
        at = lambda chars: frozenset((r, c) for r, row in enumerate(lines)  # noqa: E731
                                     for c, x in enumerate(row) if x in chars)
        players, boxes, targets = at("PS"), at("X√"), at("O√S")
        if len(players) != 1 or not boxes or len(boxes) != len(targets):
            raise ValueError("board needs one player and as many targets as boxes (at least one)")
        env = cls(**kwargs)
        env._fixed = (len(lines), len(lines[0]), at("_OX√PS"), targets, next(iter(players)), boxes)
        env.reset(0)
        return env

    # ---- room generation -------------------------------------------------------------------

    def _generate(self, rng: np.random.Generator) -> tuple:
        n = self.size
        for _ in range(_MAX_ATTEMPTS):
            floor = self._random_walk(rng)
            if len(floor) < 3:
                continue
            cells = sorted(floor)
            t, p = rng.choice(len(cells), size=2, replace=False)
            target = cells[t]
            player, box = self._reverse_play(floor, target, cells[p])
            if box == target:
                continue
            plan = solve(floor, frozenset([target]), player, frozenset([box]))
            if plan is None or (self.max_solution_len is not None and len(plan) > self.max_solution_len):
                continue
            return n, n, floor, frozenset([target]), player, frozenset([box])
        raise RuntimeError(f"no solvable {n}x{n} Sokoban room with solution <= {self.max_solution_len} "
                           f"moves in {_MAX_ATTEMPTS} tries; raise size or max_solution_len")

    def _random_walk(self, rng: np.random.Generator) -> frozenset[Pos]:
        n = self.size
        carved = np.zeros((n, n), dtype=bool)
        directions = _DIRECTIONS
        d = directions[rng.integers(4)]
        pos = np.array([rng.integers(1, n - 1), rng.integers(1, n - 1)])
        for _ in range(int(1.5 * (n + n))):  # gym-sokoban's walk length for an n x n room
            if rng.random() < 0.35:
                d = directions[rng.integers(4)]
            pos = np.clip(pos + d, 1, n - 2)
            carved[pos[0] - 1:pos[0] + 2, pos[1] - 1:pos[1] + 2] |= _MASKS[rng.integers(len(_MASKS))]
        carved[[0, -1], :] = carved[:, [0, -1]] = False  # the border stays wall
        return frozenset((int(r), int(c)) for r, c in np.argwhere(carved))

    def _reverse_play(self, floor: frozenset[Pos], target: Pos, player: Pos) -> tuple[Pos, Pos]:
        """Breadth-first reverse play from the solved state over at most ``search_depth`` states;
        returns (player, box) of the first state with the largest box displacement."""
        start = (player, target)
        seen, queue = {start}, deque([start])
        best, best_score = start, 0
        while queue and len(seen) < self.search_depth:
            p, b = queue.popleft()
            score = abs(b[0] - target[0]) + abs(b[1] - target[1])
            if score > best_score:
                best, best_score = (p, b), score
            for d in _DIRECTIONS:
                nxt = _add(p, d)
                if nxt not in floor or nxt == b:
                    continue
                # Walk away, or walk away pulling a box that sits right behind the player.
                moves = [(nxt, b)] + ([(nxt, p)] if b == (p[0] - d[0], p[1] - d[1]) else [])
                for state in moves:
                    if state not in seen:
                        seen.add(state)
                        queue.append(state)
        return best

    # ---- episode ---------------------------------------------------------------------------

    def reset(self, seed: int, dynamics_seed: int | None = None) -> str:
        room = self._fixed or self._generate(np.random.default_rng(seed))
        self.rows, self.cols, self.floor, self.targets, self.player, self.boxes = room
        self._dyn = np.random.default_rng([_DYNAMICS_SALT, seed if dynamics_seed is None else dynamics_seed])
        self._turn, self._n_actions, self._done = 0, 0, False
        return self.render()

    def _apply(self, action: str) -> tuple[float, str | None]:
        if self.slip > 0 and self._dyn.random() < self.slip:
            action = _PERPENDICULAR[action][int(self._dyn.integers(2))]
        self.player, self.boxes, pushed_to = _move(self.floor, self.player, self.boxes, action)
        reward = 0.0
        if pushed_to is not None:  # the player now stands where the pushed box was
            reward += (BOX_ON_REWARD * (pushed_to in self.targets)
                       + BOX_OFF_REWARD * (self.player in self.targets))
        return reward, "success" if self.boxes <= self.targets else None

    # ---- text ------------------------------------------------------------------------------

    def render(self) -> str:
        """The observation text: coordinates block (walls only in the grid), then the grid."""
        def symbol(cell: Pos) -> str:
            if cell not in self.floor:
                return "#"
            if cell == self.player:
                return "S" if cell in self.targets else "P"
            if cell in self.boxes:
                return "√" if cell in self.targets else "X"
            return "O" if cell in self.targets else "_"

        grid = ["".join(symbol((r, c)) for c in range(self.cols)) for r in range(self.rows)]
        return "\n".join([
            f"Board size: {self.rows} rows x {self.cols} cols (zero-indexed)",
            f"Targets: {_fmt(self.targets)}", f"Boxes: {_fmt(self.boxes - self.targets)}",
            f"Boxes on target: {_fmt(self.boxes & self.targets)}", f"Player: {_fmt([self.player])}",
            "Grid Map:", *grid])

    def system_prompt(self) -> str:
        k = self.max_actions_per_turn
        slippery = " Moves may slip sideways." if self.slip > 0 else ""
        return (
            "You are a Sokoban solver.\n"
            f"Goal: push every box X onto a target O.{slippery}\n"
            "Coordinates are (row, col), zero-indexed from the top-left.\n"
            "Walk into a box to push it one cell if the cell beyond is free; boxes cannot be pulled.\n"
            "Symbols: # wall, _ empty, O target, X box, √ box on target, P player, S player on target.\n"
            f"Actions: {', '.join(ACTIONS)}.\n"
            f"Up to {self.max_actions} actions in total, at most {k} per turn, separated by ||.\n"
            f"Example: <answer>{' || '.join(['Right', 'Up'][:k])}</answer>")

    # ---- expert ----------------------------------------------------------------------------

    def solve(self) -> list[str] | None:
        """Shortest action list from the current state, or None when the room is stuck."""
        return solve(self.floor, self.targets, self.player, self.boxes)

    def _grounded_think(self, plan: list[str] | None, next_actions: str) -> str:
        here = f"Player: {_fmt([self.player])}. Boxes: {_fmt(self.boxes)}. Targets: {_fmt(self.targets)}."
        if plan is None:
            return f"{here} No plan solves this room. Next: {next_actions}."
        return f"{here} Plan: {' '.join(plan) or 'done'}. Next: {next_actions}."

    def _fallback_move(self) -> list[str]:
        # Stuck room: any move that changes the state, so the turn is at least a legal one.
        for action in ACTIONS:
            if _move(self.floor, self.player, self.boxes, action)[:2] != (self.player, self.boxes):
                return [action]
        return ACTIONS[:1]
