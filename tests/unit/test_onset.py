"""The collapse criterion of docs/reproduction.md Part 3 on hand-made curves."""
import math

from ragen2_core.report.onset import collapse_onset, windows


def curve(values, start=1, every=1):
    return list(range(start, start + every * len(values), every)), list(values)


def test_windows_average_consecutive_values_and_drop_a_short_tail():
    # [0.4, 0.2, 0.2, 0.2 | 0.1, 0.1, nan, 0.4 | 0.9]: means 0.25 at step 4, (0.1+0.1+0.4)/3 = 0.2 at 8;
    # the lone 9th value is no window.
    w = windows(curve([0.4, 0.2, 0.2, 0.2, 0.1, 0.1, float("nan"), 0.4, 0.9]), 4)
    assert [s for s, _ in w] == [4, 8]
    assert math.isclose(w[0][1], 0.25) and math.isclose(w[1][1], 0.2)


def test_template_return_counts_from_the_lowest_earlier_window():
    # Windows 0.34, 0.10, 0.05, 0.20, 0.26: the rise above the lowest earlier window (0.05) is 0.15
    # at step 16 and 0.21 at step 20, the first >= 0.2. Success 0.6 at step 20 is below 0.9.
    template = curve([0.34] * 4 + [0.10] * 4 + [0.05] * 4 + [0.20] * 4 + [0.26] * 4)
    o = collapse_onset(template, curve([]), curve([0.5, 0.6], start=10, every=10))
    assert o.collapsed and o.signal == "template" and o.step == 20
    assert math.isclose(o.template_rise, 0.21) and math.isnan(o.mi_fall)


def test_a_fall_from_the_start_is_not_a_return_and_a_solved_task_is_not_a_collapse():
    falling = curve([0.34] * 4 + [0.10] * 4 + [0.00] * 4)
    assert not collapse_onset(falling, curve([]), curve([])).collapsed
    # The same 0.21 rise, but validation success is already 0.92 when it happens.
    template = curve([0.05] * 4 + [0.26] * 4)
    o = collapse_onset(template, curve([]), curve([0.92], start=4))
    assert not o.collapsed and math.isclose(o.template_rise, 0.21)


def test_mi_fall_from_the_highest_earlier_pair():
    # MI every 4 steps: pairs (1.0, 1.2) -> 1.1 at step 5, (1.9, 2.0) -> 1.95 at 13, (1.7, 1.6) -> 1.65
    # at 21: 0.30 below the highest earlier pair, which is the threshold.
    mi = curve([1.0, 1.2, 1.9, 2.0, 1.7, 1.6], every=4)
    o = collapse_onset(curve([]), mi, curve([]))
    assert o.collapsed and o.signal == "mi" and o.step == 21 and math.isclose(o.mi_fall, 0.30)


def test_template_wins_a_tie_and_the_earlier_signal_is_reported():
    template = curve([0.0] * 4 + [0.3] * 4)                          # crosses at step 8
    mi = curve([2.0, 2.0, 1.5, 1.5], start=2, every=2)               # pairs 2.0 at 4, 1.5 at 8: crosses at 8
    assert collapse_onset(template, mi, curve([])).signal == "template"
    early_mi = curve([2.0, 2.0, 1.5, 1.5], start=1, every=1)         # crosses at step 4
    o = collapse_onset(template, early_mi, curve([]))
    assert (o.signal, o.step) == ("mi", 4)


def test_success_fall_and_failure_step():
    from ragen2_core.report.onset import failure_step, success_fall_step
    # Validations 0.21, 0.24, 0.20, 0.18: 0.18 is the first at least 0.05 below the best (0.24).
    val = curve([0.21, 0.24, 0.20, 0.18], start=20, every=20)
    assert success_fall_step(val) == 80
    # The template rises 0.2 above its lowest window at step 8, before success falls.
    template = curve([0.3] * 4 + [0.5] * 4 + [0.5] * 4)
    assert failure_step(template, val) == 8
    assert failure_step(curve([0.3] * 12), val) == 80
    assert failure_step(curve([0.3] * 12), curve([0.2, 0.3], start=20, every=20)) is None


class FakeTrial:
    def __init__(self, **curves):
        self.curves = curves

    def curve(self, metric):
        return self.curves.get(metric, ([], []))


def test_curve_rows_name_each_window_by_its_steps():
    from types import SimpleNamespace

    from ragen2_core.report.onset import curve_rows
    # Logged every 2 steps from 2: windows of 2 readings are steps 2-4 (0.1, 0.3 -> 0.2) and 6-8
    # (0.5, nan -> 0.5); the lone reading at step 10 is no window.
    t = FakeTrial(**{"actor/entropy": curve([0.1, 0.3, 0.5, float("nan"), 0.9], start=2, every=2)})
    t.arm, t.condition, t.seed = "kl", "all", 7
    rows = curve_rows(SimpleNamespace(trials=[t], arms=["kl"]), "actor/entropy", 2)
    assert rows[2] == "| kl | 7 | 2-4: 0.200, 6-8: 0.500 |"
