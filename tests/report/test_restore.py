"""Restoring a sweep archive into an MLflow store (report/restore.py, reports/restore.py): the made-up
sweep of sweep_fixture.py (TEST DATA) archived, restored into a second real sqlite store and read
back. A real sweep restored and resumed is in tests/sweep/test_sweep_e2e.py."""
import pytest
from mlflow.tracking import MlflowClient

from report_scripts import script
from sweep_fixture import EXPERIMENT, write_sweep
from ragen2_core.report.archive import load
from ragen2_core.report.collect import collect, eval_samples
from ragen2_core.report.restore import RESTORED, AlreadyThere, restore

INSTANCE = "2026-12-01_10-00-00"


@pytest.fixture(scope="module")
def archived(tmp_path_factory):
    """The fixture sweep (one trial FAILED) as an archive of a sweep instance, as sweeps/run.py tags it."""
    root = tmp_path_factory.mktemp("restore")
    uri = write_sweep(root, failed=("filter", 0.01, 2))
    client = MlflowClient(uri)
    parent = collect(uri, EXPERIMENT).parent["run_id"]
    client.set_tag(parent, "ragen2.instance", INSTANCE)
    assert script("archive").main([EXPERIMENT, "--out", str(root / "data"), "--tracking-uri", uri]) == 0
    return root / "data" / f"{EXPERIMENT}.json.gz"


def test_finished_trials_come_back_as_they_were_archived(archived, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert script("restore").main([str(archived), "--tracking-uri", uri]) == 0
    old, new = load(archived), collect(uri, EXPERIMENT)
    # 12 trials, one FAILED: 11 restored; the failed one is left for --resume to run again
    assert len(old.trials) == 12 and len(new.trials) == 11
    assert {t.status for t in new.trials} == {"FINISHED"}
    by_id = {t.trial_id: t for t in new.trials}
    for t in old.trials:
        if t.status != "FINISHED":
            assert t.trial_id not in by_id
            continue
        b = by_id[t.trial_id]
        assert (b.arm, b.condition, b.seed, b.stop_reason, b.params) == (t.arm, t.condition, t.seed, t.stop_reason, t.params)
        assert (b.start_ms, b.end_ms) == (t.start_ms, t.end_ms)
        assert b.tags.pop("mlflow.parentRunId") == new.parent["run_id"] != t.tags.pop("mlflow.parentRunId")
        assert b.tags == t.tags
        assert b.history == t.history and b.missing == t.missing
        assert eval_samples(new, b) == eval_samples(old, t) and sorted(eval_samples(new, b)) == [10, 20]
    # the planned trials (trials.csv), the spec and the sweep run's tags, plus where it came from
    assert (new.expected, new.spec_text, new.axes) == (old.expected, old.spec_text, old.axes)
    tags = dict(new.parent["tags"])
    assert tags.pop(RESTORED) == archived.name
    assert tags == old.parent["tags"] and new.parent["start_ms"] == old.parent["start_ms"]


def test_a_second_restore_into_the_same_store_is_refused(archived, tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert script("restore").main([str(archived), "--tracking-uri", uri]) == 0
    capsys.readouterr()
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(EXPERIMENT).experiment_id
    before = len(client.search_runs([exp]))
    assert script("restore").main([str(archived), "--tracking-uri", uri]) == 2
    err = capsys.readouterr().err
    assert f"instance {INSTANCE} already" in err and f"--resume {INSTANCE}" in err
    assert len(client.search_runs([exp])) == before == 12  # 1 sweep run + 11 trials, nothing added
    with pytest.raises(AlreadyThere):
        restore(load(archived), uri, source="again")


def test_an_archive_without_a_sweep_instance_is_refused(tmp_path, capsys):
    # the fixture's own parent has no ragen2.instance tag: not a sweeps/run.py instance, nothing to resume
    uri = write_sweep(tmp_path, failed=None)
    assert script("archive").main([EXPERIMENT, "--out", str(tmp_path / "data"), "--tracking-uri", uri]) == 0
    target = f"sqlite:///{tmp_path / 'other.db'}"
    assert script("restore").main([str(tmp_path / "data" / f"{EXPERIMENT}.json.gz"), "--tracking-uri", target]) == 2
    assert "no sweep instance" in capsys.readouterr().err
    assert MlflowClient(target).get_experiment_by_name(EXPERIMENT) is None  # refused before anything was written


def test_a_missing_or_foreign_file_is_named(tmp_path, capsys):
    assert script("restore").main([str(tmp_path / "none.json.gz"), "--tracking-uri", f"sqlite:///{tmp_path}/m.db"]) == 2
    assert "no sweep archive" in capsys.readouterr().err
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(b"not gzip")
    assert script("restore").main([str(bad), "--tracking-uri", f"sqlite:///{tmp_path}/m.db"]) == 2
    assert "not a gzipped JSON sweep archive" in capsys.readouterr().err
