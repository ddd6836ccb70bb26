"""The trainer's collapse diagnostics, filter knobs, gradient probe, cost accounting and early stops,
end to end on the tiny policy (plumbing: values are checked for meaning, not for learning)."""
import json
import math

import pytest

from ragen2_core.tracking import MemorySink
from ragen2_core.train.trainer import run
from tiny import cfg_for


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("policy-cache")


def train(tmp_path, cache, *overrides):
    sink = MemorySink()
    result = run(cfg_for(tmp_path, cache, *overrides), sink)
    return sink, result


def test_collapse_metrics_on_the_configured_cadence(tmp_path, cache):
    sink, _ = train(tmp_path, cache, "train.steps=3", "collapse.every=2", "collapse.dump_rollouts=true")
    steps = [s for s, m in sink.metrics if "collapse/mi" in m]
    assert steps == [1, 3]  # steps 0 and 2 (0-based): the batch before each update
    m = dict(sink.metrics[0][1])
    # TINY has 2 groups of 3: N = 2 prompts, K = min(4, 3) = 3 reasonings each.
    assert (m["collapse/n_prompts"], m["collapse/k_samples"]) == (2, 3)
    assert m["collapse/mi_upper_bound"] == pytest.approx(math.log(2))
    assert m["collapse/mi"] <= math.log(2) + 1e-9
    assert m["collapse/retrieval_chance"] == 0.5 and 0 <= m["collapse/retrieval_acc"] <= 1
    # The EMAs start at the first value.
    assert m["collapse/mi_perm_zscore_ema"] == m["collapse/mi_perm_zscore"]
    assert m["collapse/marginal_std_ema"] == m["collapse/marginal_std"]
    assert m["collapse/mi_zscore_ema"] == pytest.approx(m["collapse/mi_zscore"])
    third = sink.metrics[2][1]
    assert third["collapse/mi_perm_zscore_ema"] == pytest.approx(
        0.9 * m["collapse/mi_perm_zscore"] + 0.1 * third["collapse/mi_perm_zscore"])
    # The release's EMA z-score divides this step's MI gap by an EMA of the marginal std.
    ema_std = 0.9 * m["collapse/marginal_std"] + 0.1 * third["collapse/marginal_std"]
    assert third["collapse/marginal_std_ema"] == pytest.approx(ema_std)
    gap = third["collapse/mi_zscore"] * (third["collapse/marginal_std"] + 1e-3)
    assert third["collapse/mi_zscore_ema"] == pytest.approx(gap / (ema_std + 1e-3))
    assert m["time/collapse_s"] > 0
    lines = [json.loads(x) for x in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert sorted({x["step"] for x in lines}) == [1, 3] and len(lines) == 2 * 6


def test_filter_preset_and_keep_schedule(tmp_path, cache):
    sink, _ = train(tmp_path, cache, "train.steps=3", "filter=paper", "filter.value=1.0", "filter.schedule.kind=linear",
                    "filter.schedule.end=0.5", "collapse.every=0")
    values = [m["filter/value"] for _, m in sink.metrics]
    # linear over 3 steps from filter.value 1.0 to 0.5: t = 0, 1/3, 2/3
    assert values == pytest.approx([1.0, 1.0 - 0.5 / 3, 1.0 - 1.0 / 3])


def test_empty_filter_skips_the_update_and_stops_after_patience(tmp_path, cache):
    # The tiny policy's rewards tie within every group (all zero spread), so linear top_p 0.9 has a
    # threshold 0.9 * 0 - 0.01 < 0 and keeps nothing: no update runs, and the release's stop fires
    # after `empty_filter_patience` empty steps in a row.
    sink, result = train(tmp_path, cache, "train.steps=4", "collapse.every=0", "filter.value=0.9",
                         "filter.mode=linear", "stops.empty_filter_patience=2", "train.eval_every=0")
    assert [m["filter/kept_groups"] for _, m in sink.metrics] == [0, 0]
    assert [m["filter/empty_streak"] for _, m in sink.metrics] == [1, 2]
    assert all("actor/pg_loss" not in m and m["cost/kept_tokens"] == 0 for _, m in sink.metrics)
    assert result["stop_reason"] == "empty_filter" and result["steps_done"] == 2


def test_zero_task_advantage_leaves_only_the_regulariser(tmp_path, cache):
    sink, _ = train(tmp_path, cache, "train.steps=2", "filter.zero_task_advantage=true", "collapse.every=0",
                    "grad_probe.every=1", "algo.entropy_coef=0.01")
    for _, m in sink.metrics:
        assert m["actor/pg_loss"] == 0.0
        assert m["actor/grad_norm_task"] == 0.0 and m["actor/grad_norm_entropy"] > 0
        assert math.isnan(m["actor/reg_to_task_grad_ratio"])


def test_gradient_probe_components_and_buckets(tmp_path, cache):
    sink, _ = train(tmp_path, cache, "train.steps=1", "collapse.every=0", "grad_probe.every=1",
                    "grad_probe.buckets=2", "algo.kl_coef=0.01", "algo.entropy_coef=0.01")
    m = sink.metrics[0][1]
    for k in ("grad_norm_task", "grad_norm_kl", "grad_norm_entropy", "grad_norm_reg", "reg_to_task_grad_ratio"):
        assert f"actor/{k}" in m and f"grad_probe/b0/{k}" in m and f"grad_probe/b1/{k}" in m
    # At the first step the policy equals its reference: the KL gradient vanishes (k3 is flat at 0).
    assert m["actor/grad_norm_kl"] == pytest.approx(0.0, abs=1e-6)
    assert m["actor/grad_norm_entropy"] > 0
    assert m["grad_probe/b0/group_reward_std"] <= m["grad_probe/b1/group_reward_std"]
    assert m["time/grad_probe_s"] > 0


def test_whole_batch_probe_equals_the_weighted_sum_of_its_buckets(tmp_path, cache):
    # buckets=2 derives the whole batch's components from the two buckets' (one pass over the rows);
    # buckets=1 computes them directly. Same seed, same first step: the same parameters and batch,
    # and the default loss is a mean over sequences, so the two must agree. GAE advantages are
    # non-zero even where a tiny group's rewards tie, so the task component is never empty.
    common = ("train.steps=1", "collapse.every=0", "grad_probe.every=1", "algo.entropy_coef=0.01",
              "algo.advantage=gae")
    direct, _ = train(tmp_path / "direct", cache, *common, "grad_probe.buckets=1")
    derived, _ = train(tmp_path / "derived", cache, *common, "grad_probe.buckets=2")
    a, b = direct.metrics[0][1], derived.metrics[0][1]
    assert "grad_probe/b1/grad_norm_task" in b and "grad_probe/b0/grad_norm_task" not in a
    assert a["actor/grad_norm_task"] > 0
    for k in ("grad_norm_task", "grad_norm_entropy", "grad_norm_reg", "reg_to_task_grad_ratio"):
        assert b[f"actor/{k}"] == pytest.approx(a[f"actor/{k}"], rel=1e-4), k


def test_cost_accounting_adds_up(tmp_path, cache):
    sink, _ = train(tmp_path, cache, "train.steps=2", "collapse.every=0", "filter.strategy=top_k_abs", "filter.value=1")
    cum = 0
    for _, m in sink.metrics:
        assert m["cost/kept_tokens"] <= m["cost/rollout_tokens"]
        assert m["cost/wasted_rollout_frac"] == pytest.approx(1 - m["cost/kept_tokens"] / m["cost/rollout_tokens"])
        assert m["cost/tokens_per_kept_sample"] == pytest.approx(m["cost/rollout_tokens"] / 3)  # one group of 3 kept
        cum += m["cost/rollout_tokens"]
        assert m["cost/cum_rollout_tokens"] == cum
        assert m["cost/wall_s_per_update"] == pytest.approx(m["time/rollout_s"] + m["time/update_s"])


def test_random_pick_keeps_the_filters_count_and_repeats_with_the_seed(tmp_path, cache):
    args = ("train.steps=3", "collapse.every=0", "train.eval_every=0", "filter.strategy=top_k_abs", "filter.value=1",
            "filter.pick=random")
    runs = [train(tmp_path / name, cache, *args)[0] for name in ("a", "b")]
    first = [(m["filter/kept_groups"], m["filter/kept_group_reward_std"], m["rollout/reward_mean"]) for _, m in runs[0].metrics]
    assert [k for k, _, _ in first] == [1, 1, 1]  # TINY's 2 groups: one kept a step, as the spread filter keeps
    # the draw comes from (seed, step), so the same seed keeps the same groups and trains the same run
    assert [(m["filter/kept_groups"], m["filter/kept_group_reward_std"], m["rollout/reward_mean"])
            for _, m in runs[1].metrics] == first


def test_validation_floor_stops_the_run_and_records_why(tmp_path, cache):
    # A floor of 1.01 fails every validation; patience 1 stops at the first one (step 2 of 6).
    sink, result = train(tmp_path, cache, "train.steps=6", "collapse.every=0", "stops.val_floor=1.0",
                         "stops.val_floor_patience=1", "train.checkpoint_every=1")
    assert result["stop_reason"] == "val_success_floor" and result["steps_done"] == 2
    assert [s for s, _ in sink.metrics] == [1, 2]
    assert sink.tags["ragen2.stop_reason"] == "val_success_floor"
    assert json.loads((tmp_path / "result.json").read_text())["stop_reason"] == "val_success_floor"
    # No checkpoint of the stopped step: a resume cannot train past the failure.
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000000"]


def test_template_collapse_alert_can_stop_the_run(tmp_path, cache):
    # A threshold no z-score reaches fires on the first measurement with patience 1.
    _, result = train(tmp_path, cache, "train.steps=4", "collapse.every=1", "stops.mi_alert_zscore=1e9",
                      "stops.mi_alert_patience=1", "stops.mi_alert_action=stop")
    assert result["stop_reason"] == "template_collapse" and result["steps_done"] == 1
    # The same on the release's z-score EMA.
    _, result = train(tmp_path / "release", cache, "train.steps=4", "collapse.every=1", "stops.mi_alert_zscore=1e9",
                      "stops.mi_alert_patience=1", "stops.mi_alert_action=stop", "stops.mi_alert_metric=mi_zscore_ema")
    assert result["stop_reason"] == "template_collapse" and result["steps_done"] == 1


def test_every_logged_metric_is_defined_in_docs(tmp_path, cache):
    # One run with every diagnostic on (MI, gradient probe, KL, GAE critic, eval): each key it logs
    # must be named in docs/metrics.md (bucket keys grad_probe/b0/... appear there as grad_probe/b{i}/...).
    import re
    from pathlib import Path
    doc = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    named = set(re.findall(r"`([a-z_]+/[a-z_{}/]+)`", doc))
    sink, _ = train(tmp_path, cache, "train.steps=2", "collapse.every=1", "grad_probe.every=1",
                    "algo.kl_coef=0.01", "algo.advantage=gae")
    logged = {k for _, m in sink.metrics for k in m}
    missing = sorted(k for k in logged if re.sub(r"/b\d+/", "/b{i}/", k) not in named)
    assert not missing, f"logged but not defined in docs/metrics.md: {missing}"
