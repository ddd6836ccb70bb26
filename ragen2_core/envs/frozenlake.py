"""FrozenLake as a multi-turn text env.

Maps are random (tiles frozen w.p. ``p_frozen``, random distinct start and goal, a start-goal path
guaranteed); the moves themselves run through Gymnasium's own ``FrozenLakeEnv`` so that the slip
noise is exactly Gymnasium's ``success_rate`` model: the intended move w.p. ``1 - slip``, else one
of the two perpendicular moves, evenly.
"""
from __future__ import annotations

from collections import deque

import numpy as np
from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv as _GymFrozenLake

from .base import MOVES, TextEnv

Pos = tuple[int, int]

TEMPLATE_THINK = "Let me think about the moves that reach the goal safely."
# Gymnasium's action order: index = action id.
ACTIONS = ["Left", "Down", "Right", "Up"]
# Keeps the slip stream independent of the map stream when both come from the same seed.
_DYNAMICS_SALT = 0x51_1B
_MAX_ATTEMPTS = 10_000


def _fmt(cells) -> str:
    return ", ".join(f"({r}, {c})" for r, c in cells) if cells else "none"


class FrozenLakeEnv(TextEnv):
    """Reach the goal without falling into a hole; reward 1 at the goal, 0 otherwise."""

    name = "frozenlake"
    template_think = TEMPLATE_THINK
    action_names = ACTIONS

    def __init__(self, *, slip: float = 0.0, max_turns: int = 5, max_actions_per_turn: int = 2,
                 max_actions: int = 10, format_penalty: float = -0.1,
                 success_reward: float | None = None, step_penalty: float | None = None, size: int = 4,
                 p_frozen: float = 0.9, min_path_len: int = 1, scratchpad: str = "path"):
        super().__init__(slip=slip, max_turns=max_turns, max_actions_per_turn=max_actions_per_turn,
                         max_actions=max_actions, format_penalty=format_penalty,
                         success_reward=success_reward, step_penalty=step_penalty)
        if not 0.0 <= slip <= 1.0:
            raise ValueError(f"slip must be in [0, 1], got {slip}")
        if size < 2:
            raise ValueError(f"size must be >= 2, got {size}")
        if not 0.0 < p_frozen <= 1.0:
            raise ValueError(f"p_frozen must be in (0, 1], got {p_frozen}")
        if scratchpad not in ("path", "scan"):
            raise ValueError(f"scratchpad must be 'path' or 'scan', got {scratchpad!r}")
        self.size, self.p_frozen, self.min_path_len = size, p_frozen, min_path_len
        self.scratchpad = scratchpad
        self._fixed: list[str] | None = None  # set by from_grid: reset() then reuses this board
        self._gym: _GymFrozenLake | None = None

    @classmethod
    def from_grid(cls, lines: list[str], **kwargs) -> FrozenLakeEnv:
        """An env on a fixed board (``P`` start, ``_`` frozen, ``O`` hole, ``G`` goal), already reset
        with seed 0; later resets keep the board and only reseed the slip noise."""
        if sum(row.count("P") for row in lines) != 1 or sum(row.count("G") for row in lines) != 1:
            raise ValueError("board needs exactly one P and one G")
        table = str.maketrans({"P": "S", "_": "F", "O": "H", "G": "G"})
        desc = [row.translate(table) for row in lines]
        if any(set(row) - set("SFHG") for row in desc) or len({len(row) for row in desc}) != 1:
            raise ValueError(f"bad board {lines!r}: rows of equal length using only P _ O G")
        env = cls(**kwargs)
        env._fixed = desc
        env._load(desc)
        env.reset(0)
        return env

    # ---- map -------------------------------------------------------------------------------

    def _generate(self, rng: np.random.Generator) -> list[str]:
        n = self.size
        for _ in range(_MAX_ATTEMPTS):
            frozen = rng.random((n, n)) < self.p_frozen
            cells = [(int(r), int(c)) for r, c in np.argwhere(frozen)]
            if len(cells) < 2:
                continue
            i, j = rng.choice(len(cells), size=2, replace=False)
            start, goal = cells[i], cells[j]
            holes = frozenset((r, c) for r in range(n) for c in range(n) if not frozen[r, c])
            path = _bfs(n, n, holes, start, goal)
            if path is not None and len(path) >= self.min_path_len:
                return ["".join("S" if (r, c) == start else "G" if (r, c) == goal
                                else "F" if frozen[r, c] else "H" for c in range(n)) for r in range(n)]
        raise RuntimeError(f"no {n}x{n} FrozenLake map with a path of length >= {self.min_path_len} "
                           f"in {_MAX_ATTEMPTS} tries (p_frozen={self.p_frozen})")

    def _load(self, desc: list[str]) -> None:
        self.rows, self.cols = len(desc), len(desc[0])
        cells = {ch: [(r, c) for r, row in enumerate(desc) for c, x in enumerate(row) if x == ch]
                 for ch in "SGH"}
        self.start, self.goal = cells["S"][0], cells["G"][0]
        self.holes = frozenset(cells["H"])
        self._gym = _GymFrozenLake(desc=desc, is_slippery=self.slip > 0, success_rate=1.0 - self.slip,
                                   reward_schedule=(1, 0, 0))

    # ---- episode ---------------------------------------------------------------------------

    def reset(self, seed: int, dynamics_seed: int | None = None) -> str:
        if self._fixed is None:
            self._load(self._generate(np.random.default_rng(seed)))
        dyn = np.random.default_rng([_DYNAMICS_SALT, seed if dynamics_seed is None else dynamics_seed])
        self._gym.reset(seed=int(dyn.integers(2**32)))
        self._turn, self._n_actions, self._done = 0, 0, False
        return self.render()

    @property
    def player(self) -> Pos:
        return divmod(int(self._gym.s), self.cols)

    def _apply(self, action: str) -> tuple[float, str | None]:
        _, _, terminated, _, _ = self._gym.step(ACTIONS.index(action))  # the goal's reward is added by step()
        if terminated:
            return 0.0, "success" if self.player == self.goal else "hole"
        return 0.0, None

    # ---- text ------------------------------------------------------------------------------

    def render(self) -> str:
        """The observation text: coordinates block, then the grid."""
        player = self.player

        def symbol(cell: Pos) -> str:
            if cell == player:
                return "X" if cell in self.holes else "√" if cell == self.goal else "P"
            return "O" if cell in self.holes else "G" if cell == self.goal else "_"

        grid = ["".join(symbol((r, c)) for c in range(self.cols)) for r in range(self.rows)]
        return "\n".join([
            f"Board size: {self.rows} rows x {self.cols} cols (zero-indexed)",
            f"Start: {_fmt([self.start])}", f"Goal: {_fmt([self.goal])}", f"Player: {_fmt([player])}",
            f"Holes: {_fmt(sorted(self.holes))}", "Grid Map:", *grid])

    def system_prompt(self) -> str:
        k = self.max_actions_per_turn
        slippery = " The ice is slippery: a move may go sideways." if self.slip > 0 else ""
        return (
            "You are a FrozenLake solver.\n"
            f"Goal: reach the goal G from the start without falling into a hole O.{slippery}\n"
            "Coordinates are (row, col), zero-indexed from the top-left.\n"
            "Symbols: P player, _ frozen, O hole, G goal, X player in a hole, √ player on goal.\n"
            f"Actions: {', '.join(ACTIONS)}; moving into the border keeps you in place.\n"
            f"Up to {self.max_actions} actions in total, at most {k} per turn, separated by ||.\n"
            f"Example: <answer>{' || '.join(['Right', 'Up'][:k])}</answer>")

    # ---- expert ----------------------------------------------------------------------------

    def solve(self) -> list[str] | None:
        """Shortest action list from the current state to the goal. The ``path`` expert takes BFS's
        path (ties: Left, Down, Right, Up); the ``scan`` expert steps to the first move, in that order,
        whose cell is one closer to the goal, which is exactly what its reasoning writes down."""
        if self.player in self.holes:
            return None
        if self.scratchpad == "path":
            return _bfs(self.rows, self.cols, self.holes, self.player, self.goal)
        dist = self._distances()
        if self.player not in dist:
            return None
        plan, pos = [], self.player
        while pos != self.goal:
            action = next(a for a in ACTIONS if dist.get(_move(self.rows, self.cols, pos, a)) == dist[pos] - 1)
            plan.append(action)
            pos = _move(self.rows, self.cols, pos, action)
        return plan

    def _grounded_think(self, plan: list[str] | None, next_actions: str) -> str:
        here = f"Player: {_fmt([self.player])}. Goal: {_fmt([self.goal])}."
        if plan is None:
            return f"{here} No safe path found. Next: {next_actions}."
        if self.scratchpad == "scan":
            return f"{self._scan(plan[:next_actions.count('||') + 1])} Next: {next_actions}."
        path = " ".join(_fmt([cell]) for cell in self._cells(plan)) or "done"
        return f"{here} Path: {path}. Next: {next_actions}."

    def _scan(self, actions: list[str]) -> str:
        # One local comparison per move (neighbour cell, hole or not, distance): a tiny model can
        # write each piece down, but has to do all of them at once to answer without it.
        dist, parts, pos = self._distances(), [], self.player
        for action in actions:
            moves = []
            for a in ACTIONS:
                nxt = _move(self.rows, self.cols, pos, a)
                if nxt != pos:
                    moves.append(f"{a} {_fmt([nxt])} {'hole' if nxt in self.holes else f'd{dist[nxt]}'}")
            parts.append(f"At {_fmt([pos])}: {', '.join(moves)}.")
            pos = _move(self.rows, self.cols, pos, action)
        return " ".join(parts)

    def _distances(self) -> dict[Pos, int]:
        """Moves from each safe cell to the goal on the noiseless lake (unreachable cells absent)."""
        dist, queue = {self.goal: 0}, deque([self.goal])
        while queue:
            pos = queue.popleft()
            for action in ACTIONS:
                nxt = _move(self.rows, self.cols, pos, action)
                if nxt not in dist and nxt not in self.holes:
                    dist[nxt] = dist[pos] + 1
                    queue.append(nxt)
        return dist

    def _cells(self, plan: list[str]) -> list[Pos]:
        cells, (r, c) = [], self.player
        for action in plan:
            r, c = _move(self.rows, self.cols, (r, c), action)
            cells.append((r, c))
        return cells

    def _fallback_move(self) -> list[str]:
        # No plan: prefer a move that changes position without entering a hole.
        for action in ACTIONS:
            nxt = _move(self.rows, self.cols, self.player, action)
            if nxt != self.player and nxt not in self.holes:
                return [action]
        return ACTIONS[:1]


def _move(rows: int, cols: int, pos: Pos, action: str) -> Pos:
    dr, dc = MOVES[action]
    return min(max(pos[0] + dr, 0), rows - 1), min(max(pos[1] + dc, 0), cols - 1)


def _bfs(rows: int, cols: int, holes: frozenset[Pos], start: Pos, goal: Pos) -> list[str] | None:
    """Deterministic shortest path on the noiseless lake, as action names."""
    parent: dict[Pos, tuple[Pos, str] | None] = {start: None}
    queue = deque([start])
    while queue:
        pos = queue.popleft()
        if pos == goal:
            plan = []
            while parent[pos] is not None:
                pos, action = parent[pos]
                plan.append(action)
            return plan[::-1]
        for action in ACTIONS:
            nxt = _move(rows, cols, pos, action)
            if nxt not in parent and nxt not in holes:
                parent[nxt] = (pos, action)
                queue.append(nxt)
    return None
