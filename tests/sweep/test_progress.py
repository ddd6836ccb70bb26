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


def progress_of(spec, trials, finished=()):
    out = io.StringIO()
    progress = Progress(spec, {t.trial_id: t for t in trials}, total=len(trials),
                        steps={t.trial_id: 10 for t in trials}, finished=frozenset(finished), stream=out)
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
