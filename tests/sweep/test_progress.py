"""The live progress lines: counts by our trial ids, whichever run of a resumed sweep finished them."""
import io
from pathlib import Path
from types import SimpleNamespace

import yaml

from ragen2_core.sweep.progress import Progress
from ragen2_core.sweep.trials import load_spec

BASE = Path(__file__).resolve().parents[2] / "sweeps" / "base" / "frozenlake_tiny.yaml"


def sweep(tmp_path):
    """A 6-trial spec (2 arms x 3 seeds) and its trials."""
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "base": str(BASE), "storage": str(tmp_path / "runs"),
                                    "arms": {"a": {}, "b": {"algo.entropy_coef": 0.0}}, "seeds": [0, 1, 2]}))
    return load_spec(path)


def progress_of(spec, trials, finished=(), **kw):
    out = io.StringIO()
    progress = Progress(spec, {t.trial_id: t for t in trials}, total=len(trials),
                        steps={t.trial_id: 10 for t in trials}, finished=frozenset(finished), stream=out, **kw)
    return progress, out


def tune_trial(trial, status):
    return SimpleNamespace(config={"trial": trial.trial_id}, status=status)


def test_a_fresh_sweep_counts_what_tune_reports(tmp_path):
    spec, trials = sweep(tmp_path)
    progress, out = progress_of(spec, trials)
    tune = [tune_trial(trials[0], "TERMINATED"), tune_trial(trials[1], "RUNNING"), tune_trial(trials[2], "ERROR"),
            tune_trial(trials[3], "PENDING")]
    progress.on_trial_result(0, tune, tune[0], {"step": 10, "eval/success": 0.5})
    progress.on_trial_complete(0, tune, tune[0])
    line = out.getvalue().splitlines()[-1]
    # 6 trials: 1 done, 1 running, 1 failed, so 3 pending
    assert f"done {trials[0].trial_id} at step 10: eval/success 0.5 |" in line
    assert "1/6 done, 1 running, 1 failed, 3 pending | best eval/success 0.5" in line


def test_a_resume_counts_trials_finished_before_tunes_state_began(tmp_path):
    # A resume without Tune's state gives Tune only the trials left; a later resume restores that
    # state. Trials 0 and 1 finished before either; Tune then finished 2 and runs 3.
    spec, trials = sweep(tmp_path)
    progress, _ = progress_of(spec, trials, finished=[trials[0].trial_id, trials[1].trial_id])
    tune = [tune_trial(trials[2], "TERMINATED"), tune_trial(trials[3], "RUNNING")]
    progress.on_trial_start(0, tune, tune[1])
    assert progress.headline().startswith("3/6 done, 1 running, 0 failed, 2 pending")
    # A trial MLflow saw finish that Tune also holds as finished counts once.
    progress, _ = progress_of(spec, trials, finished=[trials[2].trial_id])
    progress.on_trial_start(0, tune, tune[1])
    assert progress.headline().startswith("1/6 done, 1 running, 0 failed, 4 pending")


def test_the_table_shows_each_running_trial_with_its_step(tmp_path):
    spec, trials = sweep(tmp_path)
    progress, out = progress_of(spec, trials)
    progress.every_s = 0.0
    tune = [tune_trial(trials[0], "RUNNING")]
    progress.on_trial_result(0, tune, tune[0], {"step": 4, "eval/success": 0.25, "collapse/mi": 1.5})
    progress.on_step_end(0, tune)
    row = out.getvalue().splitlines()[-1].split()
    assert row[:4] == [trials[0].trial_id, "4/10", "0.25", "1.5"]


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_the_time_left_is_the_steps_left_at_the_rate_run_so_far(tmp_path):
    spec, trials = sweep(tmp_path)
    clock = Clock()
    progress, _ = progress_of(spec, trials, clock=clock)
    tune = [tune_trial(trials[0], "RUNNING"), tune_trial(trials[1], "RUNNING")]
    for trial in tune:
        progress.on_trial_start(0, tune, trial)
        progress.on_trial_result(0, tune, trial, {"step": 1})
    clock.now = 30.0
    assert "left" not in progress.headline()            # no estimate in the first minute of results
    for step in (2, 3, 4):
        for trial in tune:
            progress.on_trial_result(0, tune, trial, {"step": step})
    clock.now = 60.0
    # 8 steps run in the 60 s since the first result (1 + 3 per trial), by 2 trials side by side:
    # 15 s a step each. Left: 6 steps in each running trial (90 s), then the 4 pending trials of 10
    # steps two by two (150 s each): 90 + 150 + 150 = 390 s, shown as 7m.
    assert progress.headline().endswith("| 1m00s, about 7m left")
    # A trial that Tune restarts from its step-2 checkpoint replays steps 3-4: no progress, more time.
    progress.on_trial_result(0, tune, tune[0], {"step": 3})
    progress.on_trial_result(0, tune, tune[0], {"step": 4})
    clock.now = 120.0
    # Still 8 useful steps, now in 120 s: 30 s a step each, 90 + 150 + 150 doubled = 780 s = 13m.
    assert progress.headline().endswith("about 13m left")


def test_a_resumed_trial_counts_its_first_step_here_not_the_steps_before_it(tmp_path):
    spec, trials = sweep(tmp_path)
    clock = Clock()
    progress, _ = progress_of(spec, trials, finished=[t.trial_id for t in trials[2:]], clock=clock)
    tune = [tune_trial(trials[0], "RUNNING"), tune_trial(trials[1], "RUNNING")]
    progress.on_trial_start(0, tune, tune[0])
    progress.on_trial_result(0, tune, tune[0], {"step": 9})    # resumed from its step-8 checkpoint
    progress.on_trial_result(0, tune, tune[1], {"step": 1})
    clock.now = 3600.0
    # 2 steps in an hour by 2 trials side by side: an hour a step each. Trial 0 has 1 step left,
    # trial 1 has 9: the sweep ends when trial 1 does, in 9 hours (not 10 steps at the pair's rate).
    assert progress.headline().endswith("| 60m00s, about 9h00m left")


def test_the_time_left_counts_a_pending_trials_checkpoint_and_no_failed_trial(tmp_path):
    spec, trials = sweep(tmp_path)
    clock = Clock()
    # Trials 0-1 finished before; 2 runs; 3 failed; 4 waits with a checkpoint of 6 steps; 5 waits.
    progress, _ = progress_of(spec, trials, finished=[trials[0].trial_id, trials[1].trial_id], clock=clock,
                              checkpointed={trials[4].trial_id: 6})
    tune = [tune_trial(trials[2], "RUNNING"), tune_trial(trials[3], "ERROR")]
    progress.on_trial_start(0, tune, tune[0])
    for step in (1, 2):
        progress.on_trial_result(0, tune, tune[0], {"step": step})
    clock.now = 60.0
    # One trial at a time, 30 s a step; left: 8 (trial 2) + 4 (trial 4) + 10 (trial 5) = 22 steps, 11 minutes.
    assert progress.headline().endswith("about 11m left")


def test_a_search_counts_its_unsampled_trials_at_the_mean_length(tmp_path):
    spec, trials = sweep(tmp_path)
    spec.search.kind = "optuna"      # its trials get ids only when sampled: 2 sampled of 6 so far
    clock = Clock()
    progress = Progress(spec, {t.trial_id: t for t in trials[:2]}, total=6,
                        steps={trials[0].trial_id: 10, trials[1].trial_id: 20}, clock=clock, stream=io.StringIO())
    tune = [tune_trial(trials[0], "RUNNING")]
    progress.on_trial_start(0, tune, tune[0])
    for step in (1, 2, 3):
        progress.on_trial_result(0, tune, tune[0], {"step": step})
    clock.now = 60.0
    # One trial at a time, 20 s a step; left: 7 in the running trial + 5 pending x 15 (the mean
    # length) = 82 steps, 27m20s.
    assert progress.headline().endswith("about 28m left")
