"""The text-environment protocol and the shared response parser.

An episode: ``obs = env.reset(seed)``, then per turn ``result = env.step(response)`` where
``response`` is the model's whole reply for the turn, ``<think>...</think><answer>...</answer>``.
Envs parse the reply themselves (with :func:`parse_response`) so that every env penalises a
malformed reply the same way and the rollout engine never needs to know an env's action set.
"""
from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

RESPONSE_RE = re.compile(r"<think>(.*?)</think>\s*<answer>(.*?)</answer>", re.DOTALL)
ACTION_SEP = "||"
NO_ACTION_LINE = "No valid action was given; the state is unchanged."
# An end reason from ``_apply`` that ends the turn, not the episode (a door that sticks, say): the
# turn's remaining actions are not made.
TURN_OVER = "turn_over"
# The (row, column) step of each grid action. Each grid env lists its actions in its own order
# (FrozenLake's is Gymnasium's action index; Sokoban's draws its rooms by index).
MOVES = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}


@dataclass(frozen=True)
class ParsedResponse:
    think: str | None          # text strictly inside <think>...</think>, None when the format failed
    actions: list[str]         # canonical action names, at most max_actions
    format_valid: bool         # tags matched and every listed action was known
    n_requested: int           # actions listed in <answer> (before truncation / dropping)


def parse_response(text: str, action_names: list[str], max_actions: int) -> ParsedResponse:
    """Parse one reply. Unknown actions are dropped (and make the turn invalid); extra actions are
    truncated to ``max_actions`` without penalty, as in the RAGEN release."""
    m = RESPONSE_RE.search(text)
    if m is None:
        return ParsedResponse(None, [], False, 0)
    lookup = {a.lower(): a for a in action_names}
    raw = [a.strip() for a in m.group(2).split(ACTION_SEP)]
    raw = [a for a in raw if a]
    known = [lookup[a.lower()] for a in raw if a.lower() in lookup]
    valid = bool(raw) and len(known) == len(raw)
    return ParsedResponse(m.group(1).strip(), known[:max_actions], valid, len(raw))


@dataclass
class StepResult:
    observation: str           # next state text (what the next turn's prompt shows)
    reward: float              # sum of action rewards this turn plus any format penalty
    done: bool                 # episode over: success, failure (hole) or budget exhausted
    success: bool              # solved and not truncated
    info: dict = field(default_factory=dict)  # format_valid, actions, n_actions_executed, ...


@dataclass(frozen=True)
class ExpertTurn:
    think: str                 # reasoning text (without tags)
    actions: list[str]         # at most max_actions_per_turn actions


class TextEnv(ABC):
    """Multi-turn text env. Subclasses set ``name``, ``action_names`` and their own reward scale
    (``success_reward``, ``step_penalty``), which a config may override."""

    name: str
    action_names: list[str]
    success_reward: float = 1.0   # added when an action reaches the goal
    step_penalty: float = 0.0     # added for every action taken (a door that sticks counts too)

    def __init__(self, *, slip: float, max_turns: int, max_actions_per_turn: int, max_actions: int,
                 format_penalty: float, success_reward: float | None = None, step_penalty: float | None = None):
        self.slip = slip
        self.max_turns = max_turns
        self.max_actions_per_turn = max_actions_per_turn
        self.max_actions = max_actions
        self.format_penalty = format_penalty
        # None keeps the env's own scale, so a config that does not shape rewards plays the env as built.
        if success_reward is not None:
            self.success_reward = success_reward
        if step_penalty is not None:
            self.step_penalty = step_penalty
        self._turn, self._n_actions, self._done = 0, 0, True  # step() needs a reset() first

    @abstractmethod
    def system_prompt(self) -> str:
        """Instructions shown once at the start of every episode."""

    @abstractmethod
    def reset(self, seed: int, dynamics_seed: int | None = None) -> str:
        """Generate the map from ``seed`` (same seed -> same map) and return the first observation.
        ``dynamics_seed`` seeds the slip noise separately, so rollouts of one group share the map
        but not their slips; None derives it from ``seed``."""

    def step(self, response: str) -> StepResult:
        """Apply one reply (think + answer). Never raises on malformed text."""
        if self._done:
            raise RuntimeError("episode is over; call reset() first")
        parsed = parse_response(response, self.action_names, self.max_actions_per_turn)
        self._turn += 1
        reward = 0.0 if parsed.format_valid else self.format_penalty
        executed, reason = [], None
        for action in parsed.actions[:self.actions_left]:
            r, reason = self._apply(action)
            reward += self.step_penalty + r + (self.success_reward if reason == "success" else 0.0)
            executed.append(action)
            self._n_actions += 1
            if reason == TURN_OVER:
                reason = None
                break
            if reason:
                break
        if reason is None and self.actions_left == 0:
            reason = "budget"
        if reason is None and self._turn >= self.max_turns:
            reason = "turns"
        self._done = reason is not None
        obs = self.render() if executed else f"{NO_ACTION_LINE}\n{self.render()}"
        info = dict(format_valid=parsed.format_valid, actions=executed, n_actions_executed=len(executed),
                    turn=self._turn, terminated_reason=reason)
        return StepResult(obs, round(reward, 6), self._done, reason == "success", info)

    @abstractmethod
    def _apply(self, action: str) -> tuple[float, str | None]:
        """Execute one canonical action: (the env's own intermediate reward, end reason "success" |
        "hole" | ... | None), or ``TURN_OVER`` to end the turn early without ending the episode. The
        step penalty and the success reward are added by ``step``."""

    @abstractmethod
    def render(self) -> str:
        """The current observation text."""

    def batch_metrics(self, step_infos) -> dict[str, float]:
        """Metrics of a batch drawn from its turns' ``info`` dicts, logged as ``rollout/<name>``: the
        env's own view of a step (the code env's sandbox outcomes); none by default."""
        return {}

    def expert_turn(self, style: str) -> ExpertTurn:
        """Optimal next actions from the current state (exact BFS solver, re-planned every turn) with
        reasoning in ``style`` 'grounded' (names positions and carries the plan) or 'template'
        (generic text independent of the observation)."""
        if style not in ("grounded", "template"):
            raise ValueError(f"unknown style {style!r}; choose 'grounded' or 'template'")
        plan = self.solve()
        k = min(self.max_actions_per_turn, self.actions_left)
        actions = (plan if plan is not None else self._fallback_move())[:k]
        if style == "template":
            return ExpertTurn(self.template_think, actions)
        return ExpertTurn(self._grounded_think(plan, " || ".join(actions) or "none"), actions)

    template_think: str  # the one observation-independent reasoning sentence of this env

    @abstractmethod
    def solve(self) -> list[str] | None:
        """Shortest action list from the current state, or None when none exists."""

    @abstractmethod
    def _fallback_move(self) -> list[str]:
        """One move that changes the state, for when no plan exists."""

    @abstractmethod
    def _grounded_think(self, plan: list[str] | None, next_actions: str) -> str:
        """Reasoning that reuses the observation's own keys ("Player: (r, c)"), so copying a
        position is the plain "same key, same value" lookup small transformers learn first, and
        carries the remaining plan as a scratchpad."""

    @property
    def actions_left(self) -> int:
        """Actions remaining in the episode budget."""
        return self.max_actions - self._n_actions
