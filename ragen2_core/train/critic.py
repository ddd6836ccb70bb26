"""The PPO critic: the policy's backbone with a scalar value head, one value per token."""
from __future__ import annotations

from transformers import AutoConfig, AutoModelForTokenClassification


def build_critic(policy_path, policy_model):
    """Value model initialised from the policy checkpoint (the head starts random).

    Dropout is off: values feed GAE, and the same inputs must give the same values when the
    update recomputes them."""
    config = AutoConfig.from_pretrained(str(policy_path), num_labels=1)
    config.classifier_dropout = 0.0
    config.pad_token_id = policy_model.config.pad_token_id
    return AutoModelForTokenClassification.from_pretrained(str(policy_path), config=config,
                                                           dtype=policy_model.dtype)
