"""The batches passed between stages: a rollout (`RolloutBatch`) and what the loss reads (`PreparedBatch`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch


@dataclass
class RolloutBatch:
    """B multi-turn trajectories; every per-token list of row b has the same length.

    ``token_ids[b]`` is the whole conversation (prompt chunks and replies, as generated);
    ``response_mask[b]`` marks the model's own tokens (env text is never trained on);
    ``token_rewards[b]`` holds each turn's reward on that turn's last reply token.
    ``think_spans[b]`` are [start, end) token spans strictly inside ``<think>...</think>`` per turn
    (the first is the first turn's reasoning, which the MI diagnostic scores);
    ``prompt_len[b]`` is the length of the first chunk (system text + first state), the "input x".
    """
    token_ids: list[list[int]]
    response_mask: list[list[int]]
    token_rewards: list[list[float]]
    episode_reward: list[float]
    success: list[bool]
    group_ids: list[int]
    env_seeds: list[int]
    n_turns: list[int]
    n_valid_turns: list[int]
    think_spans: list[list[tuple[int, int]]]
    prompt_len: list[int]
    responses: list[list[str]] = field(default_factory=list)
    truncated: list[bool] = field(default_factory=list)
    step_infos: list[list[dict]] = field(default_factory=list)  # per row and turn: the env's StepResult.info
    messages: list[list[dict]] = field(default_factory=list)  # per row: the conversation (role, content)
    # per row and token: log-prob under the engine that sampled it (0 off replies); vLLM backend only
    behavior_logp: list[list[float]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.token_ids)

    def padded(self, pad_id: int) -> dict[str, torch.Tensor]:
        """Right-padded tensors [B, T]: input_ids, attention_mask, response_mask, token_rewards."""
        T = max(len(t) for t in self.token_ids)
        B = len(self)
        out = {
            "input_ids": torch.full((B, T), pad_id, dtype=torch.long),
            "attention_mask": torch.zeros(B, T, dtype=torch.long),
            "response_mask": torch.zeros(B, T, dtype=torch.float32),
            "token_rewards": torch.zeros(B, T, dtype=torch.float32),
        }
        for b, ids in enumerate(self.token_ids):
            n = len(ids)
            out["input_ids"][b, :n] = torch.tensor(ids)
            out["attention_mask"][b, :n] = 1
            out["response_mask"][b, :n] = torch.tensor(self.response_mask[b], dtype=torch.float32)
            out["token_rewards"][b, :n] = torch.tensor(self.token_rewards[b])
        return out

    def select(self, rows: list[int]) -> "RolloutBatch":
        """The sub-batch of the given rows (used by the SNR filter)."""
        pick = lambda xs: [xs[i] for i in rows] if xs else xs  # noqa: E731
        return RolloutBatch(**{k: pick(v) for k, v in self.__dict__.items()})


@dataclass
class PreparedBatch:
    """A batch ready for the actor's loss: padded ids and per-token targets.

    ``input_ids`` and ``attention_mask`` are [B, T]; the per-token tensors are [B, T-1] and aligned
    with the next-token predictions (position t scores token t + 1): ``mask`` marks reply tokens,
    ``advantages`` the (whitened, reweighted) advantages. ``old_logp`` / ``old_entropy`` are the
    behaviour policy's (None when the update is on-policy and takes them from its own forward);
    ``ref_logp`` the reference policy's (None without KL); ``old_values`` / ``returns`` the critic's
    (None without one). ``lengths`` [B] are the rows' token counts; ``prefix_len`` / ``groups`` [B]
    let rows of one group share their first prompt's encoding (None when not shared).
    """
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    mask: torch.Tensor
    advantages: torch.Tensor
    lengths: torch.Tensor
    old_logp: Optional[torch.Tensor] = None
    old_entropy: Optional[torch.Tensor] = None
    ref_logp: Optional[torch.Tensor] = None
    old_values: Optional[torch.Tensor] = None
    returns: Optional[torch.Tensor] = None
    prefix_len: Optional[torch.Tensor] = None
    groups: Optional[torch.Tensor] = None
