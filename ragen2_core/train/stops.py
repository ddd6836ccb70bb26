"""Early stops for failed regimes, and the template-collapse alert.

Three stops follow the reference release (REFERENCE.md section 3): the filter kept nothing for
`empty_filter_patience` steps in a row; the in-group reward spread collapsed (each of the last W
steps below `spread_frac` x the mean of the first W); validation success under `val_floor` for
`val_floor_patience` validations in a row. The fourth watches an MI z-score EMA
(`stops.mi_alert_metric`, by default `collapse/mi_perm_zscore_ema`): MI indistinguishable from its
permutation null for `mi_alert_patience` measurements in a row means the reasoning no longer depends
on the input; it warns, or stops the run, per `mi_alert_action`.

    monitor = StopMonitor(cfg.stops)
    reason = monitor.after_step(kept_groups=3, group_reward_std=0.4)   # None or a stop reason
    reason = reason or monitor.after_eval(success=0.42)
    alert, reason = monitor.after_mi(zscore_ema=1.3)

State is a plain dict (`state_dict` / `load_state_dict`), so a resumed run stops exactly where an
uninterrupted one would.
"""
from __future__ import annotations

STOP_REASONS = ("empty_filter", "reward_spread_collapse", "val_success_floor", "template_collapse")


class StopMonitor:
    def __init__(self, cfg):
        self.cfg = cfg
        self.empty_streak = 0
        self.spread_first: list[float] = []   # the first W steps' spreads, then frozen
        self.spread_last: list[float] = []    # a sliding window of the last W
        self.val_fail_streak = 0
        self.mi_low_streak = 0

    # -------------------------------------------------------------- observations
    def after_step(self, *, kept_groups: int, group_reward_std: float) -> str | None:
        c = self.cfg
        self.empty_streak = self.empty_streak + 1 if kept_groups == 0 else 0
        if c.empty_filter_patience and self.empty_streak >= c.empty_filter_patience:
            return "empty_filter"
        W = c.spread_window
        if not W:
            return None
        if len(self.spread_first) < W:
            self.spread_first.append(float(group_reward_std))
            return None
        self.spread_last = (self.spread_last + [float(group_reward_std)])[-W:]
        # The last window only counts once it no longer overlaps the first (step >= 2W).
        floor = c.spread_frac * sum(self.spread_first) / W
        if len(self.spread_last) == W and all(s < floor for s in self.spread_last):
            return "reward_spread_collapse"
        return None

    def after_eval(self, *, success: float) -> str | None:
        c = self.cfg
        self.val_fail_streak = self.val_fail_streak + 1 if success < c.val_floor else 0
        if c.val_floor_patience and self.val_fail_streak >= c.val_floor_patience:
            return "val_success_floor"
        return None

    def after_mi(self, *, zscore_ema: float) -> tuple[bool, str | None]:
        """(alert raised now, stop reason or None)."""
        c = self.cfg
        if c.mi_alert_action == "off":
            return False, None
        self.mi_low_streak = self.mi_low_streak + 1 if zscore_ema < c.mi_alert_zscore else 0
        alert = self.mi_low_streak >= c.mi_alert_patience
        return alert, ("template_collapse" if alert and c.mi_alert_action == "stop" else None)

    # -------------------------------------------------------------- resume
    def state_dict(self) -> dict:
        return {"empty_streak": self.empty_streak, "spread_first": list(self.spread_first),
                "spread_last": list(self.spread_last), "val_fail_streak": self.val_fail_streak,
                "mi_low_streak": self.mi_low_streak}

    def load_state_dict(self, state: dict) -> None:
        for k, v in state.items():
            setattr(self, k, v)
