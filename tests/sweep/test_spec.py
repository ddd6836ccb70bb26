"""Sweep spec: expansion, stable trial ids, validation messages, dry run. No Ray, no training."""
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ragen2_core.config import load_config
from ragen2_core.sweep.driver import dry_run, trial_table
from ragen2_core.sweep.spec import SpecError, read_spec
from ragen2_core.sweep.trials import expand, load_spec, run_order, spec_hash, trial_config

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "sweeps" / "base" / "frozenlake_tiny.yaml"


def write(tmp_path, body: dict, name="spec.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"name": "t", "base": str(BASE), "storage": str(tmp_path / "runs"), **body},
                                   sort_keys=False))
    return path


def errors(path) -> list[str]:
    with pytest.raises(SpecError) as info:
        load_spec(path)
    return info.value.errors


def test_axes_zip_arms_seeds_expand_to_their_product(tmp_path):
    spec, trials = load_spec(write(tmp_path, {
        "axes": {"algo.kl_coef": [0.0, 0.01, 0.1], "filter.include_zero": [True, False]},
        "zip": [{"env.slip": [0.0, 0.2], "train.steps": [10, 20]}],
        "arms": {"nofilter": "nofilter", "paper": {"filter": "paper", "filter.value": 0.8}},
        "seeds": [0, 1]}))
    assert len(trials) == 2 * 3 * 2 * 2 * 2
    # zip keys move together: slip 0.2 always comes with 20 steps
    assert all((t.values["env.slip"], t.values["train.steps"]) in [(0.0, 10), (0.2, 20)] for t in trials)
    assert len({t.trial_id for t in trials}) == len(trials)
    paper = next(t for t in trials if t.arm == "paper" and t.values["algo.kl_coef"] == 0.1 and t.seed == 1)
    cfg = trial_config(spec, paper)
    # the preset is applied first and the arm's dotted key refines it
    assert (cfg.filter.mode, cfg.filter.value, cfg.algo.kl_coef, cfg.train.seed) == ("softmax", 0.8, 0.1, 1)
    assert cfg.train.resume and cfg.train.threads == 1
    # the output folder follows the instance, chosen after expansion: the same trials serve both
    assert cfg.train.output_dir == str(tmp_path / "runs" / "t" / "trials" / paper.trial_id)
    spec.instance = "2026-01-01_00-00-00"
    assert trial_config(spec, paper).train.output_dir == str(tmp_path / "runs" / "t" / spec.instance / "trials" / paper.trial_id)


def test_trials_run_seed_by_seed_each_block_holding_every_cell(tmp_path):
    spec, trials = load_spec(write(tmp_path, {"axes": {"algo.kl_coef": [0.0, 0.1]},
                                              "arms": {"a": {}, "b": {"algo.entropy_coef": 0.0}}, "seeds": [7, 3]}))
    # expansion: arm, then axis value, then seed; runs: seed (in the spec's order), then the same
    assert [(t.arm, t.values["algo.kl_coef"], t.seed) for t in trials] == [
        ("a", 0.0, 7), ("a", 0.0, 3), ("a", 0.1, 7), ("a", 0.1, 3),
        ("b", 0.0, 7), ("b", 0.0, 3), ("b", 0.1, 7), ("b", 0.1, 3)]
    assert [(t.arm, t.values["algo.kl_coef"], t.seed) for t in run_order(spec, trials)] == [
        ("a", 0.0, 7), ("a", 0.1, 7), ("b", 0.0, 7), ("b", 0.1, 7),
        ("a", 0.0, 3), ("a", 0.1, 3), ("b", 0.0, 3), ("b", 0.1, 3)]
    assert run_order(spec, trials[:3]) == [trials[0], trials[2], trials[1]]  # what is left keeps it


def test_trial_ids_are_stable_and_ignore_unrelated_changes(tmp_path):
    body = {"axes": {"algo.kl_coef": [0.0, 0.1]}, "arms": {"a": {}, "b": {"algo.entropy_coef": 0.0}}, "seeds": 2}
    _, first = load_spec(write(tmp_path, body))
    _, again = load_spec(write(tmp_path, body | {"max_concurrent": 3, "axes": {"algo.kl_coef": [0.1, 0.0, 0.5]}}))
    ids = {(t.arm, t.values["algo.kl_coef"], t.seed): t.trial_id for t in again}
    assert all(ids[(t.arm, t.values["algo.kl_coef"], t.seed)] == t.trial_id for t in first)


def test_random_search_draws_the_same_points_every_time(tmp_path):
    body = {"search": {"kind": "random", "samples": 3, "seed": 7,
                       "space": {"algo.kl_coef": {"loguniform": [1e-4, 1e-1]}, "filter.value": {"choice": [0.5, 1.0]}}},
            "seeds": 2}
    _, a = load_spec(write(tmp_path, body))
    _, b = load_spec(write(tmp_path, body))
    assert len(a) == 6 and [t.trial_id for t in a] == [t.trial_id for t in b]
    assert all(1e-4 <= t.values["algo.kl_coef"] <= 1e-1 for t in a)


def test_spec_hash_changes_with_the_question_not_with_where_results_go(tmp_path):
    a = read_spec(write(tmp_path, {"axes": {"algo.kl_coef": [0.0, 0.1]}}))
    b = read_spec(write(tmp_path, {"axes": {"algo.kl_coef": [0.0, 0.1]}, "tracking": {"uri": "sqlite:///x.db"}}))
    c = read_spec(write(tmp_path, {"axes": {"algo.kl_coef": [0.0, 0.2]}}))
    assert spec_hash(a) == spec_hash(b) != spec_hash(c)


BAD = [  # (spec body, text every message for it must contain)
    ({"fixed": {"rollout.group_sise": 4}}, ["fixed.rollout.group_sise", "did you mean 'rollout.group_size'"]),
    ({"bogus": 1}, ["unknown key 'bogus'"]),
    ({"axes": {"algo.kl_coef": []}}, ["axes.algo.kl_coef", "non-empty list"]),
    ({"axes": {"algo.kl_coef": [0.0, -1]}}, ["axes.algo.kl_coef", "-1.0 is out of range", "1 of 2 trials"]),
    ({"axes": {"env.slip": "high"}}, ["axes.env.slip", "non-empty list"]),
    ({"fixed": {"env.slip": "high"}}, ["fixed.env.slip", "expected float"]),
    ({"arms": {"x": "papr"}}, ["arms.x", "unknown preset 'papr'"]),
    ({"arms": {"x": {"filter": "papr"}}}, ["arms.x.filter", "did you mean 'paper'"]),
    ({"fixed": {"filter.value.x": 1}}, ["fixed.filter.value.x", "is a value, not a section"]),
    ({"zip": [{"env.slip": [0.0, 0.1], "train.steps": [5]}]}, ["zip[0]", "equal length"]),
    ({"search": {"kind": "grd"}}, ["search.kind", "did you mean 'grid'"]),
    ({"seeds": 0}, ["seeds", "out of range"]),
    ({"resources": {"cpu": 0}}, ["resources.cpu", "out of range"]),
    ({"fixed": {"train.seed": 3}}, ["fixed.train.seed", "seeds"]),
    ({"fixed": {"algo.kl_coef": 0.1}, "axes": {"algo.kl_coef": [0.0]}}, ["axes.algo.kl_coef", "also set in fixed"]),
    ({"name": "has space"}, ["name", "usable sweep name"]),
    ({"base": "missing.yaml"}, ["base", "not found"]),
]


@pytest.mark.parametrize("body,needles", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_spec_names_the_field(tmp_path, body, needles):
    found = errors(write(tmp_path, body))
    assert any(all(n in e for n in needles) for e in found), found
    assert all(e.startswith(str(tmp_path / "spec.yaml")) for e in found), found


def test_all_errors_come_back_together_with_lines(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text(f"name: t\nbase: {BASE}\nfixed:\n  algo.kl_coef: -1\naxes:\n  env.slip: [0.0, 1.5]\n"
                    "arms:\n  a: papr\nseeds: [0, 0]\n")
    found = errors(path)
    assert len(found) == 4, found
    by_key = {k: e for e in found for k in ("fixed.algo.kl_coef", "axes.env.slip", "arms.a", "seeds") if k in e}
    assert by_key["fixed.algo.kl_coef"].startswith(f"{path}:4:")
    assert by_key["axes.env.slip"].startswith(f"{path}:6:")
    assert by_key["arms.a"].startswith(f"{path}:8:") and by_key["seeds"].startswith(f"{path}:9:")


def test_every_ablation_loads():
    for path in sorted((ROOT / "ablations").rglob("*.yaml")):
        text = path.read_text()
        assert text.startswith("#") and "python sweeps/run.py" in text, f"{path.name}: opening comment"
        spec, trials = load_spec(path)
        # GPU variants and the FrozenLake study's sweeps keep the file names of the doors study's; their
        # sweep names carry the folder's prefix so stores never mix them.
        prefix = {"gpu": "gpu_", "frozenlake_scan": "scan_"}.get(path.parent.name, "")
        assert trials and spec.name == prefix + path.stem


def test_cli_dry_run_prints_the_table(tmp_path):
    path = write(tmp_path, {"axes": {"algo.kl_coef": [0.0, 0.1]}, "arms": {"nofilter": "nofilter", "paper": "paper"},
                            "seeds": 2})
    proc = subprocess.run([sys.executable, str(ROOT / "sweeps" / "run.py"), str(path), "--dry-run"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "8 trials" in proc.stdout and "algo.kl_coef" in proc.stdout
    spec, trials = load_spec(path)
    assert all(t.trial_id in proc.stdout for t in trials)
    assert proc.stdout == dry_run(spec, trials)
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "runs").exists()


def test_trial_table_keeps_the_specs_key_order_as_group_names_do(tmp_path):
    # kl_coef before entropy_coef in the spec: sorting would put entropy_coef first and spell the
    # planned condition differently from the trials' group names.
    path = write(tmp_path, {"zip": [{"algo.kl_coef": [0.0, 0.3], "algo.entropy_coef": [0.3, 0.0]}]})
    spec, trials = load_spec(path)
    rows = trial_table(spec, trials)
    assert list(rows[0]) == ["trial_id", "arm", "seed", "algo.kl_coef", "algo.entropy_coef"]
    assert all([w.split("=")[0] for w in t.group.split()[1:]] == list(r)[3:] for t, r in zip(trials, rows))


def test_cli_bad_spec_exits_2_before_anything(tmp_path):
    path = write(tmp_path, {"axes": {"algo.kl_coef": [-1.0]}, "fixed": {"rollout.group_sise": 4}})
    proc = subprocess.run([sys.executable, str(ROOT / "sweeps" / "run.py"), str(path)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2
    assert "axes.algo.kl_coef" in proc.stderr and "rollout.group_sise" in proc.stderr
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "runs").exists()


def test_optuna_needs_one_arm_and_seed_and_probes_the_range_ends(tmp_path):
    found = errors(write(tmp_path, {"search": {"kind": "optuna", "samples": 4,
                                               "space": {"env.slip": {"uniform": [0.0, 2.0]}}}, "seeds": 2}))
    assert any("search.kind" in e and "single arm and seed" in e for e in found), found
    assert any("search.space.env.slip" in e and "2.0 is out of range" in e for e in found), found
    spec, trials = load_spec(write(tmp_path, {"search": {"kind": "optuna", "samples": 4,
                                                         "space": {"env.slip": {"uniform": [0.0, 0.3]}}}}))
    assert len(trials) == 1 and len(expand(spec)) == 1


def test_relative_spec_path_still_finds_its_base_from_another_directory(tmp_path, monkeypatch):
    # Ray workers run trials in their own working directory: a spec given by a relative path must
    # already hold absolute paths when trials load their base config there.
    repo = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(repo)
    spec, trials = load_spec("ablations/smoke.yaml")
    monkeypatch.chdir(tmp_path)
    assert spec.base_path == repo / "sweeps" / "base" / "frozenlake_tiny.yaml"
    load_config(spec.base_path, trials[0].overrides)


def test_storage_is_made_absolute_where_the_spec_is_read(tmp_path, monkeypatch):
    # Tune runs each trial in a folder of its own: a relative storage resolved there put a resumed
    # trial's checkpoints in Ray's folder, so it trained again from step 0.
    import pickle
    monkeypatch.chdir(tmp_path)
    spec, trials = load_spec(write(tmp_path, {"storage": "runs/sweeps", "seeds": 1}))
    spec.instance = "2026-01-01_00-00-00"
    expected = str(tmp_path / "runs" / "sweeps" / "t" / spec.instance / "trials" / trials[0].trial_id)
    worker_dir = tmp_path / "elsewhere"
    worker_dir.mkdir()
    monkeypatch.chdir(worker_dir)
    spec2, trial2 = pickle.loads(pickle.dumps((spec, trials[0])))  # as the worker receives them
    assert trial_config(spec2, trial2).train.output_dir == expected
