"""Gradient decomposition: spread buckets and component norms, on hand-built tensors."""
import math

import pytest
import torch

from ragen2_core.metrics.gradients import decomposition_stats, spread_buckets


def test_spread_buckets_split_ranks_evenly_with_deterministic_ties():
    # stds [.5, 0, 2, 0, 1, 3]: ascending ranks (ties by index) 1, 3, 0, 4, 2, 5
    # 2 buckets: ranks 0-2 -> bucket 0 (groups 1, 3, 0), ranks 3-5 -> bucket 1 (groups 4, 2, 5)
    std = torch.tensor([0.5, 0.0, 2.0, 0.0, 1.0, 3.0])
    assert spread_buckets(std, n_buckets=2).tolist() == [0, 0, 1, 0, 1, 1]
    # 3 buckets of 2: {1, 3}, {0, 4}, {2, 5}
    assert spread_buckets(std, n_buckets=3).tolist() == [1, 0, 2, 0, 1, 2]
    assert spread_buckets(std, n_buckets=1).tolist() == [0] * 6
    with pytest.raises(ValueError):
        spread_buckets(std, n_buckets=0)


def test_decomposition_norms_and_ratio():
    # task g = [3, 4] -> 5; kl = [1, 0], entropy = [0, 1] -> reg = [1, 1] -> sqrt 2; ratio sqrt(2) / 5
    t = {"task": [torch.tensor([3.0, 4.0])], "kl": [torch.tensor([1.0, 0.0])], "entropy": [torch.tensor([0.0, 1.0])]}
    s = decomposition_stats(t)
    assert s["grad_norm_task"] == pytest.approx(5.0)
    assert s["grad_norm_kl"] == pytest.approx(1.0) and s["grad_norm_entropy"] == pytest.approx(1.0)
    assert s["grad_norm_reg"] == pytest.approx(math.sqrt(2))
    assert s["reg_to_task_grad_ratio"] == pytest.approx(math.sqrt(2) / 5)


def test_decomposition_off_components_and_zero_task():
    s = decomposition_stats({"task": [torch.zeros(2)], "kl": None, "entropy": [torch.tensor([0.0, 2.0])]})
    assert s["grad_norm_kl"] == 0.0 and s["grad_norm_reg"] == pytest.approx(2.0)
    # Zero task gradient (all groups zero-spread under GRPO): the ratio is unbounded, reported as NaN.
    assert math.isnan(s["reg_to_task_grad_ratio"])
