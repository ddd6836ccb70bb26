"""The loop's metrics for a few steps, pinned before the objective was assembled in
`algo/objective.py` (values recorded by the loop at commit f3e002d, then only renamed: see
tests/fixtures/pinned_metrics.json). The refactor must not change behaviour, so the same runs,
with the options this version added set to what that loop did, give the same numbers."""
import json
import math
from pathlib import Path

import pytest

import ragen2_core.train.trainer as trainer
from ragen2_core.algo.advantages import whiten
from ragen2_core.tracking import MemorySink
from tiny import cfg_for

PINNED = json.loads((Path(__file__).parents[1] / "fixtures" / "pinned_metrics.json").read_text())
# The behaviour of f3e002d in this version's terms: no dual clip, unclamped k3.
OLD_BEHAVIOUR = ["algo.clip_ratio_c=null", "algo.kl_estimator=k3_exact"]
NOISY = ("time/", "perf/")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("policy-cache")


@pytest.mark.parametrize("case", sorted(PINNED["cases"]))
def test_metrics_match_the_loop_before_the_refactor(tmp_path, cache, case, monkeypatch):
    pinned = PINNED["cases"][case]
    # That loop whitened GAE advantages with the population variance (now veRL's unbiased one).
    monkeypatch.setattr(trainer, "whiten", lambda x, m: whiten(x, m, unbiased=False))
    sink = MemorySink()
    trainer.run(cfg_for(tmp_path, cache, "train.steps=3", "train.eval_every=3", *pinned["overrides"], *OLD_BEHAVIOUR),
                sink)
    assert [s for s, _ in sink.metrics] == [s for s, _ in pinned["metrics"]]
    for (step, now), (_, then) in zip(sink.metrics, pinned["metrics"]):
        for key, value in then.items():
            if key.startswith(NOISY) or "wall" in key:
                continue
            assert key in now, (case, step, key)
            if isinstance(value, float) and math.isnan(value):
                assert math.isnan(now[key]), (case, step, key)
            else:
                assert now[key] == pytest.approx(value, rel=1e-5, abs=1e-7), (case, step, key)
