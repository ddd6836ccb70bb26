"""The filter page (filter_figures.filter_pages): how often each arm's filter dropped groups and which
spreads it dropped, from hand-made trials (TEST DATA) and from the doors study's archive."""
import math
from pathlib import Path

import pytest
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from sweep_fixture import EXPERIMENT, write_sweep
from ragen2_core.report import filter_figures
from ragen2_core.report.archive import load, save
from ragen2_core.report.build import build, main as report_main
from ragen2_core.report.collect import Sweep, Trial, collect

ROOT = Path(__file__).resolve().parents[2]
DOORS = ROOT / "docs" / "data" / "doors" / "filter_vs_nofilter.json.gz"
NAN = float("nan")
NOFILTER = {"filter.strategy": "top_p", "filter.value": "1.0", "filter.include_zero": "True",
            "filter.schedule.kind": "const"}
PAPER = {"filter.strategy": "top_p", "filter.value": "0.9", "filter.mode": "softmax", "filter.include_zero": "True",
         "filter.schedule.kind": "const"}


def pdf_text(path: Path) -> tuple[int, str]:
    pypdf = pytest.importorskip("pypdf")
    reader = pypdf.PdfReader(str(path))
    return len(reader.pages), "\n".join(p.extract_text() for p in reader.pages)


def trial(tid: str, arm: str = "filter", params: dict | None = None, status: str = "FINISHED", n_groups="8",
          **curves) -> Trial:
    """A trial whose per-step curves are given by metric suffix: kept_groups=[...], kept_ratio=[...]."""
    history = {f"filter/{k}": (list(range(1, len(v) + 1)), list(v)) for k, v in curves.items()}
    history["eval/success"] = ([10], [0.5])
    params = (params or {}) | ({"rollout.n_groups": n_groups} if n_groups else {})
    return Trial(run_id=tid, trial_id=tid, arm=arm, condition="all", seed=tid[-1], status=status,
                 stop_reason="completed", params=params, tags={}, start_ms=None, end_ms=None, history=history)


def sweep_of(trials: list[Trial]) -> Sweep:
    return Sweep(tracking_uri="", experiment="hand_made_filter", experiment_id="0", parent=None, spec_text="",
                 spec={}, trials=trials, expected=[], axes=[], samples={})


def test_kept_histogram_pools_the_steps_of_every_trial():
    trials = [trial("a0", kept_groups=[8, 7, 7, 8]), trial("a1", kept_groups=[6, 8])]
    h = filter_figures.kept_histogram(trials)
    # 6 steps in all: one at 6 kept, two at 7, three at 8; nothing below 6
    assert h["shares"] == pytest.approx([0, 0, 0, 0, 0, 0, 1 / 6, 2 / 6, 3 / 6])
    assert (h["steps"], h["n_groups"], h["sources"], h["counted"]) == (6, 8, {"logged": 2}, 2)
    # kept 44 of 6 x 8 = 48 group-steps; 3 of the 6 steps dropped at least one group
    assert h["mean_fraction"] == pytest.approx(44 / 48)
    assert h["filtered_share"] == pytest.approx(0.5)


def test_counts_come_from_kept_ratio_when_kept_groups_was_not_logged():
    old = trial("b0", kept_ratio=[0.875, 1.0, 0.75])
    assert filter_figures.kept_counts(old) == ([7, 8, 6], "from kept_ratio")   # 0.875 x 8 = 7, 0.75 x 8 = 6
    h = filter_figures.kept_histogram([old])
    assert h["shares"] == pytest.approx([0, 0, 0, 0, 0, 0, 1 / 3, 1 / 3, 1 / 3])
    # kept_groups wins over kept_ratio when both were logged
    assert filter_figures.kept_counts(trial("b1", kept_groups=[5], kept_ratio=[0.5]))[0] == [5]


def test_no_group_count_is_guessed():
    counts, why = filter_figures.kept_counts(trial("c0", n_groups=None, kept_ratio=[0.875]))
    assert counts == [] and "rollout.n_groups" in why
    counts, why = filter_figures.kept_counts(trial("c1", kept_ratio=[0.3]))      # 0.3 x 8 = 2.4 groups
    assert counts == [] and "not a whole number" in why
    counts, why = filter_figures.kept_counts(trial("c2"))
    assert counts == [] and "neither" in why
    h = filter_figures.kept_histogram([trial("c0", n_groups=None, kept_ratio=[0.875])])
    assert (h["shares"], h["mean_fraction"], h["n_groups"]) == ([], None, None)


def test_spreads_leave_out_steps_that_dropped_nothing():
    t = trial("d0", dropped_group_reward_std_max=[NAN, 0.0, 0.35, NAN])
    assert filter_figures.spreads([t], filter_figures.DROPPED_STD) == [0.0, 0.35]
    assert filter_figures.spreads([trial("d1", dropped_group_reward_std_max=[NAN, NAN])], filter_figures.DROPPED_STD) == []
    assert filter_figures.spreads([trial("d2", kept_ratio=[1.0])], filter_figures.DROPPED_STD) is None   # never logged


def test_failed_trials_are_left_out_of_a_cell():
    sweep = sweep_of([trial("e0", kept_groups=[8, 8]), trial("e1", kept_groups=[1], status="FAILED")])
    cell = filter_figures.filter_cell(sweep, "filter", "all")
    assert cell["trials"] == 1 and cell["shares"][-1] == 1.0


def test_no_filter_arms_make_room_only_past_one_page():
    assert filter_figures.is_no_filter(trial("f0", params=NOFILTER)) and not filter_figures.is_no_filter(trial("f1", params=PAPER))
    annealed = NOFILTER | {"filter.schedule.kind": "linear"}
    assert not filter_figures.is_no_filter(trial("f2", params=annealed))
    few = [trial("g0", "nofilter", NOFILTER, kept_ratio=[1.0]), trial("g1", "paper", PAPER, kept_ratio=[0.875])]
    shown, left_out = filter_figures.filter_cells(sweep_of(few))
    assert [c["arm"] for c in shown] == ["nofilter", "paper"] and left_out == []
    many = few + [trial(f"h{i}", f"paper{i}", PAPER, kept_ratio=[0.875]) for i in range(3)]   # 5 cells > 4
    shown, left_out = filter_figures.filter_cells(sweep_of(many))
    assert [c["arm"] for c in left_out] == ["nofilter"]
    assert [c["arm"] for c in shown] == ["paper", "paper0", "paper1", "paper2"]


def test_report_has_the_filter_page(tmp_path):
    new = [trial("p0", "paper", PAPER, kept_groups=[8, 7, 7, 8], dropped_group_reward_std_max=[NAN, 0.0, 0.0, NAN],
                 kept_group_reward_std=[0.3, 0.4, 0.4, 0.3]),
           trial("p1", "paper", PAPER, kept_groups=[6, 8], dropped_group_reward_std_max=[0.35, NAN],
                 kept_group_reward_std=[0.45, 0.3])]
    old = [trial(f"n{i}", "nofilter", NOFILTER, kept_ratio=[1.0, 1.0]) for i in range(2)]
    path = save(sweep_of(new + old), tmp_path / "hand_made_filter.json.gz")
    assert report_main(["--archive", str(path), "--out", str(tmp_path / "r.pdf")]) == 0
    _, text = pdf_text(tmp_path / "r.pdf")
    words = " ".join(text.split())
    assert filter_figures.FILTER_TITLE in words
    # paper: 44/48 kept = 0.917, 3 of 6 steps dropped; nofilter: derived 8 of 8 on its 4 steps
    assert "mean kept fraction 0.917" in words and "dropped a group on 50 % of 6 steps (2 trials)" in words
    assert "dropped a group on 0 % of 4 steps (2 trials)" in words
    # paper's three dropping steps: largest dropped spreads 0, 0, 0.35
    assert "(largest dropped spread 0) on 2 of 3 steps that dropped" in words
    assert "Kept counts of 2 trial(s) are round(filter/kept_ratio × rollout.n_groups)" in words
    assert "not recorded for these trials" in words   # nofilter's old trials, beside paper's new ones


def test_new_metrics_read_from_a_store_nan_steps_included(tmp_path):
    """The trainer logs NaN as the dropped spread on a step that kept every group; MLflow keeps it and
    the page leaves that step out. Trials without rollout.n_groups get no guessed counts."""
    uri = write_sweep(tmp_path)
    run = next(t for t in collect(uri, EXPERIMENT).trials if t.trial_id == "filter-0-0")
    client = MlflowClient(uri)
    client.log_batch(run.run_id, params=[Param("rollout.n_groups", "8")], metrics=[
        Metric("filter/kept_groups", 8, 0, 1), Metric("filter/kept_groups", 7, 0, 2),
        Metric(filter_figures.DROPPED_STD, NAN, 0, 1), Metric(filter_figures.DROPPED_STD, 0.0, 0, 2)])
    sweep = collect(uri, EXPERIMENT)
    assert any(n.startswith("filter/kept_groups: not logged by 11 of 12 trials") for n in sweep.notes)
    cell = filter_figures.filter_cell(sweep, "filter", "algo.kl_coef=0")
    # one trial of three has counts (8, then 7); the other two logged only kept_ratio, no n_groups
    assert cell["shares"] == pytest.approx([0] * 7 + [0.5, 0.5])
    assert cell["sources"]["logged"] == 1 and sum(cell["sources"].values()) == 3
    assert cell["dropped_std"] == [0.0]
    pdf, _ = build(uri, EXPERIMENT, tmp_path / "r.pdf")
    words = " ".join(pdf_text(pdf)[1].split())
    assert "dropped a group on 50 % of 2 steps (1 of 3 trials)" in words
    # the page's note counts every cell: 12 trials, one of which was given rollout.n_groups
    assert "11 trial(s) logged only filter/kept_ratio and no rollout.n_groups param" in words


def test_doors_archive_paper_filter_keeps_seven_or_eight(tmp_path):
    """The study's paper filter (softmax top-p 0.9, 8 groups, 0/1 rewards): kept ratio 0.875 or 1 at
    every step, i.e. 7 or 8 groups; the archive predates kept_groups and the dropped spreads."""
    assert report_main(["--archive", str(DOORS), "--out", str(tmp_path / "doors.pdf")]) == 0
    _, text = pdf_text(tmp_path / "doors.pdf")
    words = " ".join(text.split())
    assert filter_figures.FILTER_TITLE in words and "Dropped spreads were not recorded for this sweep" in words
    sweep = load(DOORS)
    paper = filter_figures.filter_cell(sweep, "filter", "all")
    assert paper["sources"] == {"from kept_ratio": 10} and paper["steps"] == 400   # 10 seeds x 40 steps
    assert [k for k, share in enumerate(paper["shares"]) if share] == [7, 8]
    assert math.isclose(sum(paper["shares"]), 1.0)
    nofilter = filter_figures.filter_cell(sweep, "nofilter", "all")
    assert nofilter["shares"] == [0] * 8 + [1.0] and nofilter["filtered_share"] == 0
