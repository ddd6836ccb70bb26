"""Sinks against real backends: a sqlite MLflow store under tmp, real files, real streams."""
import io
import json
import logging
import math

import pytest
from mlflow.tracking import MlflowClient

from ragen2_core.tracking import (FanoutSink, JsonlSink, MemorySink, MetricSink, MlflowSink, StdoutSink,
                                  git_sha, run_tags)
from ragen2_core.tracking.mlflow_sink import MAX_PARAM_CHARS, PARENT_TAG, ensure_experiment


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One sqlite store for the module: creating its schema takes seconds."""
    root = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{root}/mlflow.db"
    MlflowClient(uri).search_experiments()  # runs the schema migration once, up front
    return uri


def history(client, run_id, key):
    return [(m.step, m.value) for m in client.get_metric_history(run_id, key)]


# ----------------------------------------------------------------------------- MLflow

def test_mlflow_round_trip(store, tmp_path):
    artifact = tmp_path / "config.yaml"
    artifact.write_text("algo: {kl_coef: 0.0}\n")
    sink = MlflowSink(tracking_uri=store, experiment="roundtrip", run_name="r1", tags={"ragen2.seed": "0"})
    assert isinstance(sink, MetricSink) and sink.tracking_uri == store
    sink.log_params({"algo.kl_coef": 0.0, "env.name": "sokoban", "notes": "x" * 10_000, "envs": ["a", "b"]})
    for step in range(3):
        sink.log_metrics({"rollout/success": step / 10, "actor/entropy": 1.0 + step, "actor/kl": math.nan}, step)
    sink.set_tags({"ragen2.config_hash": "abc123"})
    sink.log_artifact(artifact)
    sink.log_artifact(artifact, artifact_path="configs")
    sink.log_text("step,success\n0,0.0\n", "tables/summary.csv")
    sink.close()

    client = MlflowClient(store)  # a fresh client sees only what reached the store
    run = client.get_run(sink.run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "r1"
    db_dir = store[len("sqlite:///"):].rsplit("/", 1)[0]
    assert run.info.artifact_uri.startswith(f"{db_dir}/mlruns/roundtrip/")  # next to the db, not the cwd
    params = run.data.params
    assert params["algo.kl_coef"] == "0.0" and params["env.name"] == "sokoban" and params["envs"] == "['a', 'b']"
    assert len(params["notes"]) == MAX_PARAM_CHARS and params["notes"].endswith("[truncated]")
    assert run.data.tags["ragen2.seed"] == "0" and run.data.tags["ragen2.config_hash"] == "abc123"
    assert history(client, sink.run_id, "rollout/success") == [(0, 0.0), (1, 0.1), (2, 0.2)]
    assert history(client, sink.run_id, "actor/entropy") == [(0, 1.0), (1, 2.0), (2, 3.0)]
    assert all(math.isnan(v) for _, v in history(client, sink.run_id, "actor/kl"))  # NaN is kept
    top = {f.path for f in client.list_artifacts(sink.run_id)}
    assert top == {"config.yaml", "configs", "tables"}
    assert [f.path for f in client.list_artifacts(sink.run_id, "tables")] == ["tables/summary.csv"]
    assert client.download_artifacts(sink.run_id, "tables/summary.csv", str(tmp_path)).endswith("summary.csv")


def test_mlflow_resume_continues_the_same_run(store, caplog):
    first = MlflowSink(tracking_uri=store, experiment="resume")
    first.log_params({"seed": 0, "lr": 1e-3})
    for step in (1, 2):
        first.log_metrics({"rollout/success": step * 0.1}, step)
    first.close()

    again = MlflowSink(tracking_uri=store, experiment="ignored-on-resume", run_id=first.run_id)
    assert MlflowClient(store).get_run(first.run_id).info.status == "RUNNING"
    with caplog.at_level(logging.WARNING):
        again.log_params({"seed": 0, "lr": 2e-3, "extra": "new"})  # same, changed, new
    assert "'lr'" in caplog.text and "immutable" in caplog.text
    for step in (3, 4):
        again.log_metrics({"rollout/success": step * 0.1}, step)
    again.close()

    client = MlflowClient(store)
    runs = client.search_runs([first.experiment_id])
    assert [r.info.run_id for r in runs] == [first.run_id]
    run = runs[0]
    assert run.info.status == "FINISHED"
    assert run.data.params == {"seed": "0", "lr": "0.001", "extra": "new"}
    assert history(client, first.run_id, "rollout/success") == [(s, s * 0.1) for s in (1, 2, 3, 4)]


def test_mlflow_child_run_has_parent_tag(store):
    parent = MlflowSink(tracking_uri=store, experiment="nested", run_name="sweep")
    child = MlflowSink(tracking_uri=store, experiment="nested", run_name="trial-0", parent_run_id=parent.run_id)
    child.close()
    parent.close()
    tags = MlflowClient(store).get_run(child.run_id).data.tags
    assert tags[PARENT_TAG] == parent.run_id
    assert PARENT_TAG not in MlflowClient(store).get_run(parent.run_id).data.tags


def test_two_open_sinks_log_to_separate_runs(store):
    a = MlflowSink(tracking_uri=store, experiment="parallel")
    b = MlflowSink(tracking_uri=store, experiment="parallel")
    for step in range(3):  # interleaved, as two Tune trials in one worker would be
        a.log_metrics({"rollout/success": 1.0}, step)
        b.log_metrics({"rollout/success": 0.0}, step)
    a.close("FINISHED")
    b.close("FAILED")
    client = MlflowClient(store)
    assert a.run_id != b.run_id and a.experiment_id == b.experiment_id
    assert [v for _, v in history(client, a.run_id, "rollout/success")] == [1.0] * 3
    assert [v for _, v in history(client, b.run_id, "rollout/success")] == [0.0] * 3
    assert client.get_run(b.run_id).info.status == "FAILED"


def test_context_manager_marks_failed_run(store):
    with pytest.raises(RuntimeError):
        with MlflowSink(tracking_uri=store, experiment="ctx") as sink:
            raise RuntimeError("diverged")
    assert MlflowClient(store).get_run(sink.run_id).info.status == "FAILED"
    with pytest.raises(ValueError, match="FINISHED"):
        sink.close("DONE")


def test_experiment_created_by_a_rival_between_lookup_and_insert_is_reused(store):
    rival = MlflowClient(store)

    class LateLookup(MlflowClient):
        """A real client whose first lookup predates the rival's insert: the race, made deterministic."""
        seen = False

        def get_experiment_by_name(self, name):
            if not self.seen:
                self.seen = True
                rival.create_experiment(name)
                return None
            return super().get_experiment_by_name(name)

    exp_id = ensure_experiment(LateLookup(store), "raced")  # its insert hits RESOURCE_ALREADY_EXISTS
    assert exp_id == rival.get_experiment_by_name("raced").experiment_id
    assert ensure_experiment(MlflowClient(store), "raced") == exp_id


def test_deleted_experiment_names_the_fix(store):
    client = MlflowClient(store)
    client.delete_experiment(ensure_experiment(client, "gone"))
    with pytest.raises(ValueError, match="restore"):
        MlflowSink(tracking_uri=store, experiment="gone")


def test_resume_unknown_run_names_the_fix(store):
    with pytest.raises(ValueError, match="cannot resume"):
        MlflowSink(tracking_uri=store, run_id="0" * 32)


# ----------------------------------------------------------------------------- JSONL

def test_jsonl_appends_and_encodes_nonfinite_as_strings(tmp_path):
    path = tmp_path / "run" / "metrics.jsonl"
    with JsonlSink(path) as sink:
        sink.log_params({"algo.kl_coef": 0.0, "envs": ["sokoban"], "p": float("inf")})
        sink.log_metrics({"rollout/success": 0.5, "actor/kl": math.nan, "a": math.inf, "b": -math.inf}, 1)
    with JsonlSink(path) as sink:  # a resumed run appends to the same file
        sink.set_tags({"ragen2.seed": "0"})
        sink.log_metrics({"rollout/success": 0.75}, 2)
        sink.log_text("hello", "notes.txt")
        sink.log_artifact(path, "logs")

    lines = path.read_text().splitlines()
    raw = [json.loads(line) for line in lines]  # strict JSON: no bare NaN / Infinity tokens
    assert all("NaN" not in line.replace('"NaN"', "") for line in lines)
    assert [r["type"] for r in raw] == ["params", "metrics", "close", "tags", "metrics", "text", "artifact", "close"]
    assert raw[1]["metrics"] == {"rollout/success": 0.5, "actor/kl": "NaN", "a": "Infinity", "b": "-Infinity"}
    assert raw[0]["params"]["p"] == "Infinity" and raw[2]["status"] == "FINISHED"

    records = JsonlSink.read(path)
    m = records[1]["metrics"]
    assert math.isnan(m["actor/kl"]) and m["a"] == math.inf and m["b"] == -math.inf
    assert [(r["step"], r["metrics"]["rollout/success"]) for r in records if r["type"] == "metrics"] == [(1, 0.5), (2, 0.75)]


# ----------------------------------------------------------------------------- stdout

def test_stdout_line_shows_step_values_and_eta():
    out = io.StringIO()
    sink = StdoutSink(total_steps=100, stream=out)
    sink.log_metrics({"rollout/success": 0.41, "rollout/reward_mean": 0.38, "actor/entropy": 1.234,
                      "actor/kl": 0.0012, "eval/success": 0.52, "time/step_s": 1.9, "other/x": 5.0}, 12)
    line = out.getvalue().strip()
    assert line.startswith("step  12/100 [#---------]")
    for part in ("success 0.41", "reward 0.38", "entropy 1.23", "kl 0.0012", "eval 0.52", "1.9 s/step", "eta 2m47s"):
        assert part in line
    assert "other" not in line


def test_stdout_tolerates_missing_keys_nan_and_no_total(capsys):
    sink = StdoutSink(every=2)
    sink.log_metrics({}, 1)  # skipped by `every`
    sink.log_metrics({"actor/kl": math.nan, "actor/entropy": "n/a"}, 2)
    sink.log_metrics({"rollout/success": 1.0}, 4)
    sink.close("KILLED")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("step 2 entropy n/a kl nan | ")  # s/step measured from step 1
    assert lines[1].startswith("step 4 success 1 | ") and "s/step" in lines[1] and "eta" not in lines[1]
    assert lines[2] == "run ended: KILLED"


# ----------------------------------------------------------------------------- fan-out, memory

class Exploding(MemorySink):
    def log_metrics(self, metrics, step):
        raise OSError("disk full")

    def close(self, status="FINISHED"):
        super().close(status)
        raise OSError("cannot close")


def test_fanout_forwards_everything_and_closes_all_when_one_raises(tmp_path):
    a, bad, b = MemorySink(), Exploding(), MemorySink()
    sink = FanoutSink(a, bad, b)
    sink.log_params({"x": 1})
    sink.set_tags({"t": "v"})
    sink.log_text("hi", "hi.txt")
    sink.log_artifact(tmp_path, "dir")
    with pytest.raises(OSError, match="disk full"):
        sink.log_metrics({"m": 1.0}, 0)
    assert a.history("m") == b.history("m") == [(0, 1.0)]
    with pytest.raises(OSError, match="cannot close"):
        sink.close("FAILED")
    for s in (a, bad, b):
        assert s.closed_status == "FAILED"
    assert a.params == b.params == {"x": 1} and a.tags == {"t": "v"} and b.texts == {"hi.txt": "hi"}
    assert b.artifacts == [(str(tmp_path), "dir")]


def test_memory_history_and_latest():
    sink = MemorySink()
    metrics = {"rollout/success": 0.1, "actor/kl": 0.0}
    sink.log_metrics(metrics, 1)
    metrics["rollout/success"] = 0.2  # the sink keeps a copy, not the caller's dict
    sink.log_metrics({"rollout/success": 0.3}, 2)
    sink.log_metrics({"eval/success": 0.5}, 2)
    assert sink.history("rollout/success") == [(1, 0.1), (2, 0.3)]
    assert sink.history("eval/success") == [(2, 0.5)] and sink.history("missing") == []
    assert sink.latest() == {"rollout/success": 0.3, "actor/kl": 0.0, "eval/success": 0.5}


# ----------------------------------------------------------------------------- run metadata

def test_run_tags_and_git_sha(tmp_path):
    tags = run_tags("0123456789ab", 7, None)
    assert tags["ragen2.config_hash"] == "0123456789ab" and tags["ragen2.seed"] == "7"
    assert tags["ragen2.git_sha"] == "unknown"
    assert tags["ragen2.torch"] not in ("", "missing") and tags["ragen2.python"].count(".") == 2
    assert set(tags) >= {"ragen2.transformers", "ragen2.deepspeed"}
    assert git_sha(tmp_path) is None  # not a repository
    sha = git_sha(__file__.rsplit("/", 1)[0])
    assert sha is None or len(sha.split("-")[0]) == 40
