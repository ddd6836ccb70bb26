"""Text envs by name, so configs and scripts can pick one with a string."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict

from .base import TextEnv
from .code import CodeEnv
from .doors import DoorsEnv
from .frozenlake import FrozenLakeEnv
from .math import MathEnv
from .sokoban import SokobanEnv

_ENVS: dict[str, type[TextEnv]] = {"frozenlake": FrozenLakeEnv, "sokoban": SokobanEnv, "math": MathEnv,
                                   "code": CodeEnv,
                                   "doors": DoorsEnv}
ENV_NAMES: list[str] = list(_ENVS)
SINGLE_TURN: frozenset[str] = frozenset({"math", "code"})  # one reply per episode, seeds split by content


def make_env(name: str, **kwargs) -> TextEnv:
    """A fresh env ``name`` built with constructor ``kwargs`` (call ``reset`` before use)."""
    if name not in _ENVS:
        raise ValueError(f"unknown env {name!r}; choose one of {', '.join(ENV_NAMES)}")
    return _ENVS[name](**kwargs)


def env_kwargs(env_cfg, name: str | None = None, *, slip: float | None = None) -> dict:
    """Constructor arguments of env ``name`` (default: ``env_cfg.name``) from the ``env`` section."""
    name = name or env_cfg.name
    common = dict(slip=env_cfg.slip if slip is None else slip, max_turns=env_cfg.max_turns,
                  max_actions_per_turn=env_cfg.max_actions_per_turn,
                  max_actions=env_cfg.max_actions, format_penalty=env_cfg.format_penalty)
    if name in SINGLE_TURN:  # they draw validation problems from a held-out share for these seeds
        common["val_seed_start"] = env_cfg.val_seed_start
    else:
        common |= dict(success_reward=env_cfg.success_reward, step_penalty=env_cfg.step_penalty)
    return {**common, **asdict(getattr(env_cfg, name))}


def env_factory(env_cfg, name: str | None = None, *, slip: float | None = None) -> Callable[[], TextEnv]:
    """A no-argument constructor of the configured env (the rollout engine makes one per episode)."""
    kwargs = env_kwargs(env_cfg, name, slip=slip)
    name = name or env_cfg.name
    return lambda: make_env(name, **kwargs)
