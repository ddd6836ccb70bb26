"""Sweep archives (report/archive.py): a made-up sweep in a real sqlite MLflow store, saved with
reports/archive.py, read back, and reported from the file alone (TEST DATA, see sweep_fixture.py)."""
import gzip
import json

import pytest

from report_scripts import script
from sweep_fixture import EXPERIMENT, write_sweep
from ragen2_core.report.archive import BadArchive, load, open_sweep, same_content, save
from ragen2_core.report.build import build, main as report_main
from ragen2_core.report.collect import UnknownExperiment, collect, eval_samples




@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("archive")
    uri = write_sweep(root, failed=("filter", 0.01, 2))
    assert script("archive").main([EXPERIMENT, "--out", str(root / "data"), "--tracking-uri", uri]) == 0
    return uri, root / "data" / f"{EXPERIMENT}.json.gz"


def test_round_trip_holds_what_the_store_holds(saved):
    uri, path = saved
    store, back = collect(uri, EXPERIMENT), load(path)
    assert len(back.trials) == len(store.trials) == 12
    by_id = {t.run_id: t for t in back.trials}
    for t in store.trials:
        b = by_id[t.run_id]
        assert (b.arm, b.condition, b.seed, b.status, b.params, b.tags) == (t.arm, t.condition, t.seed, t.status, t.params, t.tags)
        assert b.history == t.history and b.final("eval/success") == t.final("eval/success")
        assert eval_samples(back, b) == eval_samples(store, t)  # from the file, not the store
    # the failed trial's late samples file was never logged: one step, the same in both
    failed = next(t for t in back.trials if t.status == "FAILED")
    assert sorted(eval_samples(back, failed)) == [10]
    assert (back.expected, back.spec, back.axes) == (store.expected, store.spec, store.axes)
    assert back.notes[:-1] == store.notes and "archive" in back.notes[-1]


def test_an_optional_metric_is_kept_where_logged_and_never_noted_missing(saved):
    uri, path = saved
    back = load(path)
    probe = "grad_probe/b0/grad_norm_task"
    # the fixture logs it at steps 1 and 11 in the seed-0 trials only (0.5 x step)
    assert {t.seed for t in back.trials if probe in t.history} == {"0"}
    assert all(t.history[probe] == ([1, 11], [0.5, 5.5]) for t in back.trials if t.seed == "0")
    assert not any(probe in t.missing for t in back.trials)
    assert not any(probe in note for note in back.notes)


def test_saving_twice_gives_the_same_bytes(saved, tmp_path):
    uri, path = saved
    assert script("archive").main([EXPERIMENT, "--out", str(tmp_path), "--tracking-uri", uri]) == 0
    assert (tmp_path / path.name).read_bytes() == path.read_bytes()


def test_report_from_archive_equals_report_from_store(saved, tmp_path):
    uri, path = saved
    _, from_store = build(uri, EXPERIMENT, tmp_path / "store.pdf")
    assert report_main(["--archive", str(path), "--out", str(tmp_path / "file.pdf")]) == 0
    from_file = json.loads((tmp_path / "file.json").read_text())
    assert from_file["experiment"] == EXPERIMENT
    for key in ("table", "comparisons", "predictors", "trials", "probability_of_improvement"):
        assert from_file[key] == json.loads(json.dumps(from_store[key])), key


def test_study_and_power_read_archives(saved, capsys):
    uri, path = saved
    assert script("study").main(["--tracking-uri", uri, EXPERIMENT]) == 0
    from_store = capsys.readouterr().out
    assert script("study").main([str(path)]) == 0
    assert capsys.readouterr().out == from_store
    # a reference is named by its experiment even when it was given as a file; this fixture's two
    # conditions make it no reference, which is the error expected (not "not among the sweeps")
    assert script("study").main(["--reference", EXPERIMENT, str(path)]) == 2
    assert "2 conditions" in capsys.readouterr().err
    assert script("study").main(["--baseline", "nofilterr", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "--baseline 'nofilterr' is no arm" in captured.err and "filter, nofilter" in captured.err


def test_bad_archives_are_named(tmp_path):
    with pytest.raises(UnknownExperiment, match="no sweep archive"):
        open_sweep(str(tmp_path / "missing.json.gz"), "sqlite:///unused.db")
    (tmp_path / "junk.json.gz").write_bytes(b"not gzip")
    with pytest.raises(BadArchive, match="not a gzipped JSON"):
        load(tmp_path / "junk.json.gz")
    (tmp_path / "other.json.gz").write_bytes(gzip.compress(b'{"a": 1}'))
    with pytest.raises(BadArchive, match="not a ragen2 sweep archive"):
        load(tmp_path / "other.json.gz")
    (tmp_path / "future.json.gz").write_bytes(gzip.compress(b'{"kind": "ragen2 sweep archive", "format": 99}'))
    with pytest.raises(BadArchive, match="format 99"):
        load(tmp_path / "future.json.gz")
    with pytest.raises(ValueError, match="--instance"):
        open_sweep(str(tmp_path / "future.json.gz"), "sqlite:///unused.db", instance="x")
    assert report_main(["--archive", str(tmp_path / "junk.json.gz")]) == 2
    assert report_main(["--archive", str(tmp_path / "plain.json")]) == 2


def test_a_logged_nan_reads_back_as_the_same_sweep(saved, tmp_path):
    """A NaN in a curve (e.g. actor/reg_to_task_grad_ratio when the task gradient is 0) is kept, and
    the read-back check sees the file as the same sweep, though NaN != NaN in Python."""
    _, path = saved
    sweep = load(path)
    steps, values = sweep.trials[0].history["actor/entropy"]
    sweep.trials[0].history["actor/entropy"] = (steps, [float("nan")] + values[1:])
    back = load(save(sweep, tmp_path / "nan.json.gz"))
    assert back.trials[0].history["actor/entropy"][1][0] != back.trials[0].history["actor/entropy"][1][0]  # NaN
    assert same_content(back, sweep)
    back.trials[0].history["actor/entropy"] = (steps, [0.5] + values[1:])
    assert not same_content(back, sweep)
