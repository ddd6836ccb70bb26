"""The trainer's filter stage (`train/trainer.filter_groups`) on hand-made group rewards: the
config's `filter.pick` reaches the selection, and the random control's draw follows (seed, step)."""
from types import SimpleNamespace

import torch

from ragen2_core.config import load_config
from ragen2_core.train.trainer import filter_groups

# 4 groups of 2 rollouts, spreads (std, ddof 1) 0.71, 2.83, 0, 1.41: the spread filter keeping one
# group always keeps group 1.
REWARDS = torch.tensor([[0.0, 1.0], [0.0, 4.0], [1.0, 1.0], [0.0, 2.0]], dtype=torch.float64)


class Batch:
    group_ids = [0, 0, 1, 1, 2, 2, 3, 3]

    def __len__(self):
        return len(self.group_ids)


def kept_groups(pick, seed, step):
    cfg = load_config(None, [f"filter.pick={pick}", "filter.strategy=top_k_abs", "filter.value=1",
                             f"train.seed={seed}"])
    sel, metrics, _ = filter_groups(SimpleNamespace(cfg=cfg, rank=0, world=1), step, Batch(), REWARDS)
    assert metrics["filter/kept_groups"] == 1 and len(sel.kept_rows) == 2
    return sel.keep.nonzero().flatten().tolist()[0]


def test_the_spread_filter_keeps_the_widest_group_and_the_random_control_any():
    assert {kept_groups("spread", 0, step) for step in range(40)} == {1}
    # 40 steps of one draw in 4: every group is kept at some step (a miss has chance 4 x (3/4)^40 < 1e-4),
    # the zero-spread group 2 too, since include_zero is on by default.
    assert {kept_groups("random", 0, step) for step in range(40)} == {0, 1, 2, 3}


def test_the_random_draw_repeats_with_the_seed_and_step_and_moves_with_them():
    once = [kept_groups("random", 3, step) for step in range(20)]
    assert [kept_groups("random", 3, step) for step in range(20)] == once
    assert [kept_groups("random", 4, step) for step in range(20)] != once
