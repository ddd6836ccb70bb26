"""Keep-ratio schedules with hand-derived values (total 10 steps, start 1.0, end 0.5 unless noted)."""
import math

import pytest

from ragen2_core.algo.schedules import filter_value


def kv(step, kind, **kw):
    args = {"total_steps": 10, "kind": kind, "start": 1.0, "end": 0.5, **kw}
    return filter_value(step, **args)


def test_constant():
    assert [kv(s, "const") for s in (0, 5, 10)] == [1.0, 1.0, 1.0]


def test_linear_and_clamping():
    # t = step / 10: 0 -> 1.0, 5 -> 1 - 0.5 * 0.5 = 0.75, 10 -> 0.5; -3 clamps to 0, 20 clamps to 10
    assert kv(0, "linear") == 1.0
    assert kv(5, "linear") == pytest.approx(0.75)
    assert kv(10, "linear") == pytest.approx(0.5)
    assert kv(-3, "linear") == 1.0
    assert kv(20, "linear") == pytest.approx(0.5)


def test_cosine():
    # end + (start - end) * (1 + cos(pi t)) / 2: t = 0 -> 1.0, t = .5 -> 0.5 + 0.25 = 0.75, t = 1 -> 0.5
    assert kv(0, "cosine") == pytest.approx(1.0)
    assert kv(5, "cosine") == pytest.approx(0.75)
    assert kv(10, "cosine") == pytest.approx(0.5)
    # total 4, step 1: t = .25, cos(pi/4) = .70711 -> 0.5 + 0.5 * 1.70711 / 2 = 0.92678
    assert kv(1, "cosine", total_steps=4) == pytest.approx(0.92678, abs=1e-5)


def test_step():
    # start while t < 0.5, end from the midpoint on
    assert kv(4, "step") == 1.0
    assert kv(5, "step") == 0.5
    assert kv(10, "step") == 0.5


def test_exponential():
    # start 1, end 0.25: 1 * 0.25 ** t -> t = .5 -> 0.5, t = 1 -> 0.25
    assert kv(5, "exp", end=0.25) == pytest.approx(0.5)
    assert kv(10, "exp", end=0.25) == pytest.approx(0.25)
    with pytest.raises(ValueError):
        kv(5, "exp", end=0.0)


def test_warmup_holds_start():
    # warmup 2: steps 0, 1 hold 1.0; then t = (step - 2) / 8: step 2 -> 1.0, 6 -> 0.75, 10 -> 0.5
    assert kv(0, "linear", warmup_steps=2) == 1.0
    assert kv(1, "linear", warmup_steps=2) == 1.0
    assert kv(2, "linear", warmup_steps=2) == pytest.approx(1.0)
    assert kv(6, "linear", warmup_steps=2) == pytest.approx(0.75)
    assert kv(10, "linear", warmup_steps=2) == pytest.approx(0.5)
    # warmup == total: start until the last step, end at it
    assert kv(9, "cosine", warmup_steps=10) == 1.0
    assert kv(10, "cosine", warmup_steps=10) == pytest.approx(0.5)


def test_monotone_between_endpoints():
    for kind in ("linear", "cosine", "step", "exp"):
        vals = [kv(s, kind) for s in range(11)]
        assert all(a >= b - 1e-12 for a, b in zip(vals, vals[1:])), kind
        assert all(0.5 - 1e-12 <= v <= 1.0 + 1e-12 for v in vals), kind
        assert not any(math.isnan(v) for v in vals)


def test_rejects_bad_arguments():
    with pytest.raises(ValueError):
        kv(0, "sigmoid")
    with pytest.raises(ValueError):
        kv(0, "linear", total_steps=0)
    with pytest.raises(ValueError):
        kv(0, "linear", warmup_steps=11)
