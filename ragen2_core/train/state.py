"""What every stage of a run reads (`RunContext`), the filter's outcome (`Selection`), and the run's
randomness, derived from (seed, step, purpose, rank) so a resumed run replays the same steps.

    rng = step_rng(cfg.train.seed, step, ROLLOUT_STREAM, rank=ctx.rank)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ragen2_core.algo.objective import Objective
from ragen2_core.rollout.sampler import SamplingParams
from ragen2_core.train.engine import TrainEngine
from ragen2_core.train.stops import StopMonitor


# One stream per purpose. The learner's first epoch keeps stream 1 and later epochs start at 2001, so
# that with ppo_epochs >= 2 no epoch's minibatch order shares its draws with the MI probe's prompts.
ROLLOUT_STREAM, LEARNER_STREAM, MI_PROBE_STREAM, FILTER_STREAM = 0, 1, 2, 1000
LEARNER_EPOCH_STREAM = 2000


def learner_stream(epoch: int) -> int:
    """The stream of the learner's minibatch order in PPO epoch `epoch` (0-based)."""
    return LEARNER_STREAM if epoch == 0 else LEARNER_EPOCH_STREAM + epoch


def step_rng(seed: int, step: int, stream: int, rank: int = 0) -> np.random.Generator:
    """Independent, reproducible randomness per (seed, step, purpose, data-parallel rank)."""
    return np.random.default_rng([seed, step, stream, rank])


@dataclass
class RunContext:
    """What every stage of a run reads: the config, the models and the running state."""
    cfg: object
    sink: object
    rank: int
    world: int
    out_dir: Path
    actor: TrainEngine
    critic: TrainEngine | None
    reference: object | None    # the KL reference (train.engine.reference_policy), None without KL
    tok: object
    make_env: object
    env: object                 # one instance of the env: its template sentence and batch metrics
    objective: Objective
    whiten: bool
    micro: int
    sampling: SamplingParams
    eval_sampling: SamplingParams
    monitor: StopMonitor
    policy_path: str
    prompt_format: object       # raw text or the policy's chat template (rollout/prompt.py)
    vllm: object = None         # rollout.backend=vllm: the colocated engine
    # Running state that must survive a resume: the collapse EMAs and the cost counters.
    loop: dict = field(default_factory=lambda: {"collapse_ema": None, "cum_rollout_tokens": 0, "cum_wall_s": 0.0})


@dataclass
class Selection:
    """The filter's outcome for one step."""
    keep: torch.Tensor          # [G] bool
    kept_rows: list[int]
    scale: float                # loss_scale_factor of the kept ratio
    row_weight: torch.Tensor    # [B] soft reweighting (ones when off)
