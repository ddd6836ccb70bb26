"""`reports/onset.py`'s monitor tables and refusals on the study archives kept in docs/data/mechanism/."""
from report_scripts import ROOT, script

DATA = ROOT / "docs" / "data" / "mechanism"


def test_onset_script_calibrates_on_one_archive_and_judges_on_another(capsys):
    """Real study data: the archives kept in docs/data/mechanism/."""
    onset = script("onset")
    assert onset.main(["--calibrate-on", str(DATA / "shaped_vs_filter.json.gz"),
                       str(DATA / "p1_shaped.json.gz"), str(DATA / "shaped_vs_filter.json.gz")]) == 0
    out = capsys.readouterr().out
    assert "### Thresholds picked on shaped_vs_filter (30 finished trials), judged on 6 held-out" in out
    # On shaped_vs_filter the release z-score EMA at 0.9 x its peak catches 14 of its 20 collapses
    # with no false alarm in its 10 paper-filter trials; the absolute permutation levels catch none
    # without false alarms.
    assert ("| release z-score EMA, relative | `collapse/mi_zscore_ema` < 0.9 x its highest earlier reading, "
            "3 in a row | 14 of 20, 3, 0 of 10 |") in out
    assert "| permutation z-score EMA, absolute | none catches a collapse" in out
    assert "| sweep | arm | seed |" not in out        # the per-trial table only when asked for


def test_onset_script_per_trial_rows_add_up_to_the_held_out_counts(capsys):
    onset = script("onset")
    assert onset.main(["--calibrate-on", str(DATA / "shaped_vs_filter.json.gz"), "--per-trial",
                       str(DATA / "p1_shaped.json.gz")]) == 0
    out = capsys.readouterr().out
    rows = [r for r in out.splitlines() if r.startswith("| p1_shaped |")]
    assert len(rows) == 6                              # p1_shaped's six finished trials, one row each
    # The release z-score pick is the first monitor column (both permutation families pick
    # nothing): its held-out "caught" count is the rows whose cell reads "(lead".
    summary = next(r for r in out.splitlines() if r.startswith("| release z-score EMA, relative |"))
    caught = int(summary.split(" | ")[3].split(" of ")[0])
    assert sum("(lead" in r.split(" | ")[4] for r in rows) == caught


def test_onset_script_names_a_bad_calibration_sweep_before_printing(tmp_path, capsys):
    onset = script("onset")
    missing = str(tmp_path / "missing.json.gz")
    assert onset.main(["--calibrate-on", missing, str(DATA / "p1_shaped.json.gz")]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "missing.json.gz" in captured.err


def test_onset_script_names_a_curve_no_trial_logged_with_the_nearest(capsys):
    onset = script("onset")
    p1 = str(DATA / "p1_shaped.json.gz")
    assert onset.main(["--curve", "actor/entropyy", p1]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "no trial of p1_shaped logged it; did you mean actor/entropy?" in captured.err
    assert onset.main(["--curve", "zzz", p1]) == 2
    err = capsys.readouterr().err
    assert "it logged " in err and "collapse/mi" in err  # no near name: every metric it logged
