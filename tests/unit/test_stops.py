"""Early stops fire on synthetic metric streams exactly when their rule says, and not before."""
import dataclasses

from ragen2_core.config import StopsConfig
from ragen2_core.train.stops import StopMonitor


def monitor(**kw):
    return StopMonitor(dataclasses.replace(StopsConfig(), **kw))


def feed_steps(m, kept, spread):
    return [m.after_step(kept_groups=k, group_reward_std=s) for k, s in zip(kept, spread)]


def test_empty_filter_fires_on_the_fifth_consecutive_empty_step_only():
    m = monitor(spread_window=0)
    # An empty step in between resets the streak: 4 empties, 1 kept, then 5 empties.
    out = feed_steps(m, [0, 0, 0, 0, 2, 0, 0, 0, 0, 0], [0.0] * 10)
    assert out == [None] * 9 + ["empty_filter"]


def test_reward_spread_collapse_needs_a_full_non_overlapping_last_window():
    m = monitor(spread_window=3, spread_frac=0.1, empty_filter_patience=0)
    # first window mean = (1 + 2 + 3) / 3 = 2 -> floor 0.2. Windows of the last 3 after step 6:
    # [.1 .1 .25] [.1 .25 .1] [.25 .1 .1] each hold 0.25 >= 0.2; [.1 .1 .1] at step 9 fires.
    out = feed_steps(m, [1] * 9, [1, 2, 3, 0.1, 0.1, 0.25, 0.1, 0.1, 0.1])
    assert out == [None] * 8 + ["reward_spread_collapse"]


def test_reward_spread_collapse_exact_step():
    m = monitor(spread_window=2, spread_frac=0.5, empty_filter_patience=0)
    # first window [2, 2] -> floor 1.0; steps 3, 4 are 0.9 and 0.9 -> fires at step 4, not step 3.
    out = feed_steps(m, [1] * 4, [2, 2, 0.9, 0.9])
    assert out == [None, None, None, "reward_spread_collapse"]


def test_all_zero_spread_from_the_start_never_counts_as_a_collapse():
    m = monitor(spread_window=2, empty_filter_patience=0)
    assert feed_steps(m, [1] * 10, [0.0] * 10) == [None] * 10


def test_validation_floor_needs_consecutive_failures():
    m = monitor(val_floor=0.01, val_floor_patience=3)
    out = [m.after_eval(success=s) for s in (0.0, 0.0, 0.05, 0.0, 0.0, 0.0)]
    assert out == [None, None, None, None, None, "val_success_floor"]


def test_mi_alert_warns_or_stops_after_patience():
    warn = monitor(mi_alert_zscore=2.0, mi_alert_patience=2, mi_alert_action="warn")
    assert [warn.after_mi(zscore_ema=z) for z in (5.0, 1.0, 3.0, 1.0, 1.5)] == [
        (False, None), (False, None), (False, None), (False, None), (True, None)]
    stop = monitor(mi_alert_zscore=2.0, mi_alert_patience=2, mi_alert_action="stop")
    assert [stop.after_mi(zscore_ema=z) for z in (1.0, 1.0)] == [(False, None), (True, "template_collapse")]
    off = monitor(mi_alert_action="off")
    assert off.after_mi(zscore_ema=-10.0) == (False, None)


def test_state_round_trip_continues_the_same_streaks():
    a = monitor(spread_window=2, spread_frac=0.5, empty_filter_patience=3)
    feed_steps(a, [0, 0], [2, 2])
    b = monitor(spread_window=2, spread_frac=0.5, empty_filter_patience=3)
    b.load_state_dict(a.state_dict())
    assert b.after_step(kept_groups=0, group_reward_std=0.9) == "empty_filter"
