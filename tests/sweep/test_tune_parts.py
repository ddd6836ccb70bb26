"""Pieces of the Tune / MLflow side that need no Ray cluster: NaN guard, collapse stopper, summary,
the saved state a resumed instance restores."""
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from mlflow.tracking import MlflowClient

from ragen2_core.sweep.driver import no_reused_workers, summarize, to_text
from ragen2_core.sweep.tracker import SweepTracker
from ragen2_core.sweep.trainable import CollapseStopper, TuneSink
from ragen2_core.sweep.trials import load_spec
from ragen2_core.tracking.mlflow_sink import ensure_experiment

ROOT = Path(__file__).resolve().parents[2]


def test_nan_in_a_guarded_metric_fails_the_trial(tmp_path):
    sink = TuneSink(tmp_path, "eval/success", ["actor/pg_loss"])
    with pytest.raises(FloatingPointError, match="actor/pg_loss is NaN at step 3"):
        sink.log_metrics({"actor/kl": math.nan, "actor/pg_loss": math.nan}, step=3)


def test_sink_keeps_texts_tags_and_artifacts_for_the_driver(tmp_path):
    sink = TuneSink(tmp_path, "eval/success", [])
    sink.set_tags({"a": 1})
    sink.set_tags({"b": "x"})
    sink.log_text("hello", "samples/eval_step000002.txt")
    sink.log_artifact(tmp_path, "policy")
    assert (tmp_path / "sweep" / "tags.json").read_text() == '{"a": "1", "b": "x"}'
    assert (tmp_path / "sweep" / "texts" / "samples" / "eval_step000002.txt").read_text() == "hello"
    assert '"artifact_path": "policy"' in (tmp_path / "sweep" / "artifacts.jsonl").read_text()


def test_collapse_stopper_needs_consecutive_low_measurements():
    stop = CollapseStopper("collapse/mi_perm_zscore_ema", below=2.0, patience=2)
    seen = [stop("t", r) for r in ({"collapse/mi_perm_zscore_ema": 1.0}, {"rollout/success": 0.1},
                                   {"collapse/mi_perm_zscore_ema": 3.0}, {"collapse/mi_perm_zscore_ema": 1.5},
                                   {"collapse/mi_perm_zscore_ema": 1.9})]
    assert seen == [False, False, False, False, True]
    assert not stop("other", {"collapse/mi_perm_zscore_ema": 0.0}) and not stop.stop_all()


def test_summary_groups_over_seeds(tmp_path):
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    exp = client.create_experiment("s")
    parent = client.create_run(exp, tags={"ragen2.role": "sweep"}).info.run_id
    for seed, group, status, value in [(0, "a", "FINISHED", 0.2), (1, "a", "FINISHED", 0.4), (0, "b", "FAILED", None)]:
        run = client.create_run(exp, tags={"mlflow.parentRunId": parent, "ragen2.group": group,
                                           "ragen2.seed": str(seed), "ragen2.trial_id": f"{group}{seed}"}).info.run_id
        if value is not None:
            client.log_metric(run, "eval/success", value, step=1)
        client.set_terminated(run, status)
    per_trial, per_group = summarize(client, exp, parent, "eval/success")
    assert [r["trial_id"] for r in per_trial] == ["a0", "a1", "b0"]
    a, b = per_group
    assert (a["done"], a["failed"], a["n"]) == (2, 0, 2)
    assert a["eval/success mean"] == pytest.approx(0.3) and a["std"] == pytest.approx(0.1414, abs=1e-3)
    assert (b["done"], b["failed"]) == (0, 1) and math.isnan(b["eval/success mean"])
    assert "eval/success mean" in to_text(per_group)


@pytest.mark.parametrize("broken", ["import", "build"])
def test_a_report_that_fails_does_not_cost_the_sweep(tmp_path, monkeypatch, capsys, broken):
    """write_report returns None and says how to retry, whether the report module fails to import
    or the build raises; the caller then closes the sweep run as usual."""
    import sys
    from types import SimpleNamespace

    from ragen2_core.sweep.driver import write_report
    if broken == "import":
        monkeypatch.setitem(sys.modules, "ragen2_core.report.build", None)  # import raises ImportError
    else:
        import ragen2_core.report.build as build
        monkeypatch.setattr(build, "build_report", lambda *a, **k: 1 / 0)
    spec = SimpleNamespace(experiment="exp", instance="2026-01-01_00-00-00")
    assert write_report("sqlite:///x.db", spec, parent=None, out=tmp_path / "r.pdf") is None
    err = capsys.readouterr().err
    assert "report: not built" in err and "ragen2 report --experiment exp --instance 2026-01-01_00-00-00" in err


def test_a_resumed_instance_is_told_not_to_reuse_workers(tmp_path):
    # Tune restores the newest experiment_state-*.json (largest name): only that one is rewritten,
    # and only its _reuse_actors; the rest of the state is kept as it was.
    no_reused_workers(tmp_path)  # nothing saved yet: nothing to do
    old = tmp_path / "experiment_state-2026-12-05_08-31-52.json"
    new = tmp_path / "experiment_state-2026-12-05_12-01-03.json"
    state = {"runner_data": {"_reuse_actors": True, "_iteration": 7}, "trial_data": ["x"]}
    for f in (old, new):
        f.write_text(json.dumps(state))
    no_reused_workers(tmp_path)
    assert json.loads(new.read_text()) == {"runner_data": {"_reuse_actors": False, "_iteration": 7},
                                           "trial_data": ["x"]}
    assert json.loads(old.read_text()) == state


def test_a_trial_run_remembered_from_another_store_is_looked_up_by_its_tag(tmp_path):
    # Tune's saved state keeps the tracker's trial -> MLflow run map. Resumed against another store
    # (the folder kept, the store moved or restored from an archive) those run ids are not there,
    # or belong to another sweep run: the trial's run is found by its trial id tag, else made anew.
    path = tmp_path / "moved.yaml"
    path.write_text(yaml.safe_dump({"name": "moved", "base": str(ROOT / "sweeps" / "base" / "frozenlake_tiny.yaml"),
                                    "arms": {"a": {}, "b": {"algo.kl_coef": 0.01}}, "storage": str(tmp_path / "runs")}))
    spec, trials = load_spec(path)
    spec.instance = "2026-12-01_10-00-00"
    a, b = trials
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = ensure_experiment(client, "moved")
    parent = client.create_run(exp, tags={"ragen2.role": "sweep"}).info.run_id
    other = client.create_run(exp, tags={"ragen2.role": "sweep"}).info.run_id
    a_run = client.create_run(exp, tags={"mlflow.parentRunId": parent, "ragen2.trial_id": a.trial_id,
                                         "ragen2.last_step": "7"}).info.run_id
    elsewhere = client.create_run(exp, tags={"mlflow.parentRunId": other, "ragen2.trial_id": b.trial_id}).info.run_id

    tracker = SweepTracker(uri, exp, parent, spec, {t.trial_id: t for t in trials})
    tracker.set_state({"run_ids": {a.trial_id: "0" * 32, b.trial_id: elsewhere}})
    sink_a, got_a = tracker._open(SimpleNamespace(trial_id="tune-a", config={"trial": a.trial_id}))
    sink_b, got_b = tracker._open(SimpleNamespace(trial_id="tune-b", config={"trial": b.trial_id}))
    assert (got_a, got_b) == (a, b)
    assert sink_a.run_id == a_run and tracker.last_step[a.trial_id] == 7   # found by its tag under this sweep run
    assert sink_b.run_id not in (elsewhere, "0" * 32)                      # another sweep run's: a new run here
    assert client.get_run(sink_b.run_id).data.tags["mlflow.parentRunId"] == parent
    assert tracker.get_state()["run_ids"] == {a.trial_id: a_run, b.trial_id: sink_b.run_id}
