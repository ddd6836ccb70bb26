"""The monitor page (monitor_figures.monitor_pages): when each collapse showed, when the preset
monitors fired, and every threshold's trade-off, on hand-made trials (TEST DATA) and on the study's
shaped_vs_filter archive."""
from pathlib import Path

from ragen2_core.report.archive import load
from ragen2_core.report.collect import Sweep, Trial
from ragen2_core.report.monitor_figures import monitor_pages

ROOT = Path(__file__).resolve().parents[2]
Z = "collapse/mi_perm_zscore_ema"


def trial(tid: str, arm: str, template: list[float], z: list[float]) -> Trial:
    history = {"rollout/template_frac": (list(range(1, len(template) + 1)), template),
               Z: (list(range(1, len(z) + 1)), z), "eval/success": ([len(template)], [0.3])}
    return Trial(run_id=tid, trial_id=tid, arm=arm, condition="all", seed=tid[-1], status="FINISHED",
                 stop_reason="completed", params={}, tags={}, start_ms=None, end_ms=None, history=history)


def sweep_of(trials):
    return Sweep(tracking_uri="", experiment="hand_made_monitors", experiment_id="0", parent=None, spec_text="",
                 spec={}, trials=trials, expected=[], axes=[], samples={})


def page_text(fig) -> str:
    texts = [t.get_text() for t in fig.texts]
    for ax in fig.axes:
        texts += [ax.get_title(), ax.get_xlabel(), ax.get_ylabel()] + [t.get_text() for t in ax.texts]
    return "\n".join(texts)


def table_rows(fig) -> list[list[str]]:
    (tab,) = [t for ax in fig.axes for t in ax.tables]
    cells = tab.get_celld()
    n_rows, n_cols = max(r for r, _ in cells) + 1, max(c for _, c in cells) + 1
    return [[cells[r, c].get_text().get_text() for c in range(n_cols)] for r in range(n_rows)]


def test_hand_made_trials_fill_the_table_and_the_timeline():
    rising = [0.3] * 4 + [0.5] * 4          # the template criterion: collapsed at step 8
    trials = [trial("c0", "nofilter", rising, [1.0] * 8),       # permutation alarm at step 3: lead 5
              trial("c1", "nofilter", rising, [5.0] * 8),       # no alarm: missed
              trial("q0", "paper", [0.3] * 8, [5.0] * 8)]       # no collapse, no alarm
    (fig,) = monitor_pages(sweep_of(trials))
    assert "2 of 3 finished trials collapsed" in page_text(fig)
    # the permutation monitor: caught 1 of 2 with lead 5, missed 1, no false alarm in the quiet trial;
    # the others' metrics were not logged, so they catch nothing and miss both
    assert table_rows(fig)[1:] == [
        ["collapse/mi_perm_zscore_ema < 2, 3 in a row", "1 of 2", "5 (5-5)", "1", "0 of 1"],
        ["collapse/mi_zscore_ema < 0.5 x its highest earlier reading, 3 in a row", "0 of 2", "-", "2", "0 of 1"],
        ["actor/entropy (4-step windows) < 0.5 x its highest earlier reading, 3 in a row", "0 of 2", "-", "2",
         "0 of 1"]]
    timeline = fig.axes[-1]
    assert [t.get_text() for t in timeline.get_yticklabels()] == ["nofilter 0", "nofilter 1"]


def test_without_a_template_curve_the_page_says_why():
    t = trial("x0", "a", [], [1.0] * 8)
    (fig,) = monitor_pages(sweep_of([t]))
    assert "No finished trial logged rollout/template_frac" in page_text(fig)


def test_shaped_vs_filter_archive():
    """Real study data: 20 collapsed trials, no preset monitor caught one in time, entropy fired
    once in the 10 paper-filter trials (docs/reproduction.md Part 3)."""
    (fig,) = monitor_pages(load(ROOT / "docs" / "data" / "mechanism" / "shaped_vs_filter.json.gz"))
    assert "20 of 30 finished trials collapsed" in page_text(fig)
    assert [row[1:] for row in table_rows(fig)[1:]] == [["0 of 20", "-", "20", "0 of 10"],
                                                        ["0 of 20", "-", "20", "0 of 10"],
                                                        ["0 of 20", "-", "20", "1 of 10"]]
    assert "caught in time (of 20 collapsed trials)" in page_text(fig)
