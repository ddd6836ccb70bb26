"""The chunked output head in the training loop: a run with it equals a run with whole-micro-batch
logits, through every scoring path (behaviour, reference, update)."""
import pytest

from ragen2_core.tracking import MemorySink
from ragen2_core.train.trainer import run
from tiny import cfg_for


def test_chunked_head_update_equals_full_logits(tmp_path, tmp_path_factory):
    cache = tmp_path_factory.mktemp("policy-cache")
    common = ["train.steps=2", "algo.kl_coef=0.05", "algo.ppo_epochs=2", "collapse.every=0", "algo.entropy_coef=0.01"]
    a, b = MemorySink(), MemorySink()
    run(cfg_for(tmp_path / "chunked", cache, *common, "train.logit_chunk=5"), a)
    run(cfg_for(tmp_path / "full", cache, *common, "train.logit_chunk=0"), b)
    assert [s for s, _ in a.metrics] == [s for s, _ in b.metrics] == [1, 2]
    for (_, x), (_, y) in zip(a.metrics, b.metrics):
        for k in x:
            if k.startswith(("actor/", "rollout/", "eval/")):
                assert x[k] == pytest.approx(y[k], rel=1e-4, abs=1e-6, nan_ok=True), k
