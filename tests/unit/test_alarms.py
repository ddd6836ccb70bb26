"""Collapse monitors (report/alarms.py) on hand-made curves; `reports/onset.py` on the study
archives is tests/report/test_onset_script.py."""
from ragen2_core.report.alarms import (SCANS, Alarm, alarm_step, alarm_summary, calibrate, held_out_rows,
                                       picked_alarms, scan_rows, trial_alarm_rows)

Z, TEMPLATE = "collapse/mi_perm_zscore_ema", "rollout/template_frac"


def curve(values, start=1, every=1):
    return list(range(start, start + every * len(values), every)), list(values)


class FakeTrial:
    def __init__(self, seed=0, **curves):
        self.curves, self.seed, self.arm, self.condition = curves, seed, "arm", "all"

    def curve(self, metric):
        return self.curves.get(metric, ([], []))


RISING = curve([0.3] * 4 + [0.5] * 4)     # the template criterion is met at step 8
FLAT = curve([0.3] * 8)


def test_alarm_absolute_and_relative_with_patience():
    # Permutation z-score EMA every 4 steps: 5, 3, 1.9, 2.1, 1.5, 1.2, 0.8 -> below 2 at steps 9,
    # 17, 21, 25; three in a row first at step 25 (the 2.1 at 13 resets the count).
    z = curve([5, 3, 1.9, 2.1, 1.5, 1.2, 0.8], every=4)
    assert alarm_step(z, Alarm("z", level=2.0)) == 25
    # Relative to the highest earlier reading: 1.0, 2.0, 0.9, 0.8, 0.7 -> half of 2.0 is 1.0, so
    # 0.9 (step 3), 0.8, 0.7 are low: fires at step 5. The first reading has no earlier peak.
    assert alarm_step(curve([1.0, 2.0, 0.9, 0.8, 0.7]), Alarm("r", relative=0.5)) == 5
    assert alarm_step(curve([1.0, 2.0, 0.9, 0.8, 1.1]), Alarm("r", relative=0.5)) is None
    # Windows of 4 per-step values first: [0.1]*4 -> 0.1, then three windows of 0.04 < 0.05.
    ent = curve([0.1] * 4 + [0.04] * 12)
    assert alarm_step(ent, Alarm("e", relative=0.5, window=4)) == 16



def test_alarm_summary_counts_leads_misses_and_false_alarms():
    z = "collapse/mi_perm_zscore_ema"
    rising = curve([0.3] * 4 + [0.5] * 4)                  # template criterion met at step 8
    flat = curve([0.3] * 8)
    trials = [
        FakeTrial(**{"rollout/template_frac": rising, z: curve([1.0, 1.0, 1.0], every=2)}),   # fires at 5: lead 3
        FakeTrial(**{"rollout/template_frac": rising, z: curve([5.0] * 4 + [1.0] * 3)}),     # fires at 7: lead 1
        FakeTrial(**{"rollout/template_frac": rising, z: curve([5.0] * 8 + [1.0] * 3)}),     # at 11: too late
        FakeTrial(**{"rollout/template_frac": flat, z: curve([1.0] * 3)}),                   # false alarm
        FakeTrial(**{"rollout/template_frac": flat, z: curve([5.0] * 3)}),                   # quiet
    ]
    (r,) = alarm_summary(trials, (Alarm(z, level=2.0),))
    assert (r["collapsed"], r["caught"], sorted(r["leads"]), r["missed"]) == (3, 2, [1, 3], 1)
    assert (r["quiet"], r["false_alarms"]) == (2, 1)




def test_a_rising_alarm_mirrors_a_falling_one():
    # Relative to the lowest earlier reading: 1.0, 0.5, 1.2, 1.3, 1.4 -> 2 x 0.5 = 1.0, so 1.2, 1.3
    # and 1.4 are high: fires at step 5. An absolute level: above 1.25 at steps 4 and 5 only.
    up = curve([1.0, 0.5, 1.2, 1.3, 1.4])
    assert alarm_step(up, Alarm("e", relative=2.0, rising=True)) == 5
    assert alarm_step(up, Alarm("e", level=1.25, rising=True)) is None
    assert alarm_step(up, Alarm("e", level=1.25, rising=True, patience=2)) == 5
    # The same curve falling never fires the rising alarm.
    assert alarm_step(curve([1.4, 1.3, 1.2, 0.5, 0.4]), Alarm("e", relative=2.0, rising=True)) is None


def _trials(fall_steps, quiet_zs):
    """Collapsed trials whose z falls to 1.0 from the given step on (8 readings, one a step) and
    trials that did not collapse, with the given constant z."""
    collapsed = [FakeTrial(**{TEMPLATE: RISING, Z: curve([5.0] * (s - 1) + [1.0] * (9 - s))}) for s in fall_steps]
    quiet = [FakeTrial(**{TEMPLATE: FLAT, Z: curve([z] * 8)}) for z in quiet_zs]
    return collapsed + quiet


def test_calibrate_picks_the_most_catches_within_the_false_alarm_budget():
    # Two collapsed trials (failure at step 8) whose z is 1.0 throughout: every level above 1.0 fires
    # at the third reading, step 3, lead 8 - 3 = 5. Quiet trials sit at z 3.2 and 4.2: levels 3.5
    # and 4.0 fire in one of them (false alarms 1 of 2), 4.5 and 5.0 in both.
    trials = _trials([1, 1], [3.2, 4.2])
    by_level = {r["alarm"].level: r for r in alarm_summary(trials, SCANS["permutation z-score EMA, absolute"])}
    assert by_level[1.0]["caught"] == 0                  # 1.0 < 1.0 is false: never fires
    assert [by_level[x]["caught"] for x in (2.0, 3.0, 3.5, 4.0, 4.5, 5.0)] == [2] * 6
    assert [by_level[x]["false_alarms"] for x in (2.0, 3.0, 3.5, 4.0, 4.5, 5.0)] == [0, 0, 1, 1, 2, 2]
    # Budget 0.1 x 2 quiet trials = 0.2: no false alarm allowed. 2.0 and 3.0 tie on catches and
    # lead (5), so the stricter, 2.0, is picked.
    picked = calibrate(trials, "permutation z-score EMA, absolute")
    assert picked["alarm"].level == 2.0 and picked["leads"] == [5, 5]
    # Budget 0.5 x 2 = 1: 3.5 and 4.0 qualify too but catch no more; 2.0 still wins the tie.
    assert calibrate(trials, "permutation z-score EMA, absolute", max_false=0.5)["alarm"].level == 2.0


def test_calibrate_prefers_the_longer_lead_and_says_when_nothing_qualifies():
    # One collapsed trial whose z eases 5, 4.4, 4.4, 4.4, 3.8, 3.8, 3.8, 3.8: level 4.5 fires at
    # step 4 (lead 4), level 4.0 at step 7 (lead 1), 5.0 at step 4 too but also in the quiet trial
    # at 4.8. Both 4.0 and 4.5 catch it; 4.5 is picked for its longer lead although 4.0 is stricter.
    trials = [FakeTrial(**{TEMPLATE: RISING, Z: curve([5.0, 4.4, 4.4, 4.4, 3.8, 3.8, 3.8, 3.8])}),
              FakeTrial(**{TEMPLATE: FLAT, Z: curve([4.8] * 8)})]
    picked = calibrate(trials, "permutation z-score EMA, absolute")
    assert picked["alarm"].level == 4.5 and picked["leads"] == [4]
    # Nothing collapsed: no threshold catches anything, so there is no pick.
    assert calibrate([FakeTrial(**{TEMPLATE: FLAT, Z: curve([1.0] * 8)})], "permutation z-score EMA, absolute") is None


def test_trial_alarm_rows_show_the_step_behind_each_count():
    # The trials of test_alarm_summary_counts_leads_misses_and_false_alarms, one row each: failure
    # at step 8 for the three collapsed ones (fired at 5: lead 3; at 7: lead 1; at 11: late), none
    # for the quiet ones (one fires at step 3, one never). A monitor that never fires in a collapsed
    # run reads "missed".
    trials = [FakeTrial(0, **{TEMPLATE: RISING, Z: curve([1.0, 1.0, 1.0], every=2)}),
              FakeTrial(1, **{TEMPLATE: RISING, Z: curve([5.0] * 4 + [1.0] * 3)}),
              FakeTrial(2, **{TEMPLATE: RISING, Z: curve([5.0] * 8 + [1.0] * 3)}),
              FakeTrial(3, **{TEMPLATE: FLAT, Z: curve([1.0] * 3)}),
              FakeTrial(4, **{TEMPLATE: FLAT, Z: curve([5.0] * 3)}),
              FakeTrial(5, **{TEMPLATE: RISING, Z: curve([5.0] * 8)})]
    rows = trial_alarm_rows([("s", t) for t in reversed(trials)], (Alarm(Z, level=2.0),))
    assert rows[0] == "| sweep | arm | seed | collapse showed at step | `collapse/mi_perm_zscore_ema` < 2, 3 in a row |"
    assert rows[2:] == ["| s | arm | 0 | 8 | 5 (lead 3) |", "| s | arm | 1 | 8 | 7 (lead 1) |",
                        "| s | arm | 2 | 8 | 11 (late) |", "| s | arm | 3 | - | 3 (false alarm) |",
                        "| s | arm | 4 | - | - |", "| s | arm | 5 | 8 | missed |"]


def test_held_out_rows_judge_the_calibration_pick_on_other_trials():
    cal = _trials([1, 1], [3.2, 4.2])                  # picks level 2.0 (previous test)
    held = _trials([1], [1.5])                         # caught with lead 5; the quiet 1.5 is a false alarm
    rows = held_out_rows(cal, held)
    (row,) = [r for r in rows if r.startswith("| permutation z-score EMA, absolute |")]
    assert row == ("| permutation z-score EMA, absolute | `collapse/mi_perm_zscore_ema` < 2, 3 in a row | "
                   "2 of 2, 5, 0 of 2 | 1 of 1 | 5 (5-5) | 0 | 1 of 1 |")
    # Families whose metric these trials lack catch nothing, and say so; the picks leave them out.
    assert any(r.startswith("| release z-score EMA, relative | none catches") for r in rows)
    assert picked_alarms(cal) == [Alarm("collapse/mi_perm_zscore_ema", level=2.0)]


def test_scan_rows_list_every_threshold_of_every_family():
    rows = scan_rows(_trials([1], [3.2]))
    assert len(rows) == 2 + sum(len(v) for v in SCANS.values())
