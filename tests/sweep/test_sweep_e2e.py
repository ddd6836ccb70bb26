"""A real sweep: real Ray Tune, real sqlite MLflow, the tiny policy, 2 training steps per trial.

One trial is broken on purpose (its policy path does not exist): it must fail alone, be recorded
as FAILED with its traceback, and make the driver exit 1. Running the spec again starts a second
instance; `--resume INSTANCE` continues the first. The slow tier kills the driver with SIGKILL
mid-sweep and resumes the latest instance, and runs an Optuna search; in both every trial gets its
own worker process.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from ragen2_core.report.archive import load, save
from ragen2_core.report.collect import collect
from ragen2_core.tracking import git_sha

ROOT = Path(__file__).resolve().parents[2]
RUN = [sys.executable, str(ROOT / "sweeps" / "run.py")]
TINY = {"policy": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 64,
                   "vocab_size": 300},
        "warmstart": {"envs": ["frozenlake"], "steps": 30, "episodes": 64, "batch_size": 8},
        "rollout": {"n_groups": 2, "group_size": 3, "max_new_tokens": 24},
        "env": {"max_turns": 2, "val_seeds": 4},
        "train": {"eval_every": 2, "steps": 2},
        "algo.actor_lr": 1e-3,
        # the barely warm-started policy never succeeds; the trainer's early stops would end runs at once
        "stops": {"spread_window": 0, "empty_filter_patience": 0, "val_floor_patience": 0}}


def write_spec(tmp: Path, name: str, cache: Path, **body) -> Path:
    fixed = {**TINY, "policy": {**TINY["policy"], "cache_dir": str(cache)}, **body.pop("fixed", {})}
    spec = {"name": name, "base": str(ROOT / "sweeps" / "base" / "frozenlake_tiny.yaml"), "fixed": fixed,
            "storage": str(tmp / "runs"), "resources": {"cpu": 1}, "max_concurrent": 2, **body}
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def sweep(tmp: Path, spec: Path, *args, timeout=600) -> subprocess.CompletedProcess:
    env = os.environ | {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run(RUN + [str(spec), "--progress-every", "5", *args], cwd=tmp, env=env,
                          capture_output=True, text=True, timeout=timeout)


def runs_of(uri: str, experiment: str) -> tuple:
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("ragen2.role") == "sweep"]
    children = [r for r in runs if r.data.tags.get("ragen2.role") == "trial"]
    return client, parents, children


def worker_pids(sweep_root: Path) -> dict[str, int]:
    """Each trial's worker process id as Tune recorded it with its last result."""
    out = {}
    for f in sweep_root.glob("*/*/result.json"):
        lines = [line for line in f.read_text().splitlines() if line.strip()]
        out[f.parent.name] = json.loads(lines[-1])["pid"]
    return out


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("policy-cache")


def corrupt_policy(folder: Path) -> Path:
    """A policy folder whose config and tokenizer read, so the driver's preflight passes it, but whose
    weights are garbage: a failure that only loading the weights finds, inside the trial."""
    from ragen2_core.policy.model import build_tiny_qwen2
    from ragen2_core.policy.tokenizer import train_tokenizer

    tok = train_tokenizer(["<think>Let me think.</think><answer>Left</answer>"] * 8, vocab_size=100)
    build_tiny_qwen2(tok, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1,
                     intermediate_size=32, seed=0).save_pretrained(folder)
    tok.save_pretrained(folder)
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")
    return folder


def test_sweep_layout_fault_isolation_and_resume(tmp_path, cache):
    # The ppo arm (GAE, a critic, KL) is a trial whose setup loads a value head, which transformers
    # reports through sys.stdout; under Tune's log_to_file that stream once lacked isatty().
    broken_model = corrupt_policy(tmp_path / "broken-model")
    spec = write_spec(tmp_path, "e2e", cache, arms={"a": {}, "ppo": {"algo.kl_coef": 0.01, "algo.advantage": "gae"},
                                                    "broken": {"policy.model": str(broken_model)}})
    uri = f"sqlite:///{tmp_path}/mlflow.db"  # the default: mlflow.db in the cwd
    first = sweep(tmp_path, spec)
    assert first.returncode == 1, first.stdout[-3000:] + first.stderr[-3000:]
    assert "[sweep] done" in first.stdout and "[sweep] failed broken-" in first.stdout
    assert "mlflow ui --backend-store-uri" in first.stdout

    client, parents, children = runs_of(uri, "e2e")
    assert len(parents) == 1 and len(children) == 3
    parent = parents[0]
    assert parent.info.status == "FAILED" and parent.data.params["spec.fixed.algo.actor_lr"] == "0.001"
    assert {"spec.yaml", "trials.csv", "summary"} <= {a.path for a in client.list_artifacts(parent.info.run_id)}
    by_arm = {r.data.tags["ragen2.arm"]: r for r in children}
    for arm in ("a", "ppo"):
        run = by_arm[arm]
        tags = run.data.tags
        assert run.info.status == "FINISHED"
        assert tags["mlflow.parentRunId"] == parent.info.run_id and tags["ragen2.seed"] == "0"
        assert tags["ragen2.trial_id"].startswith(arm + "-") and tags["ragen2.stop_reason"] == "completed"
        for tag in ("ragen2.config_hash", "ragen2.git_sha", "ragen2.group"):
            assert tag in tags, tag
        assert run.data.params["train.steps"] == "2" and run.data.params["train.threads"] == "1"
        # every point the trainer logged, once: two steps, eval at step 2
        assert [m.step for m in client.get_metric_history(run.info.run_id, "rollout/success")] == [1, 2]
        assert [m.step for m in client.get_metric_history(run.info.run_id, "eval/success")] == [2]
        assert {"config.yaml", "policy", "samples"} <= {a.path for a in client.list_artifacts(run.info.run_id)}
    assert by_arm["ppo"].data.params["algo.kl_coef"] == "0.01" and by_arm["ppo"].data.params["algo.advantage"] == "gae"
    assert len(client.get_metric_history(by_arm["ppo"].info.run_id, "critic/value_loss")) == 2
    broken = by_arm["broken"]
    assert broken.info.status == "FAILED"
    error = client.download_artifacts(broken.info.run_id, "error.txt", str(tmp_path))
    assert "safetensors" in Path(error).read_text().lower()

    # every run carries the commit (and dirty flag) of the code that trained it, as the sweep run does
    sha = parent.data.tags["ragen2.git_sha"]
    assert {r.data.tags["ragen2.git_sha"] for r in children} == {sha}
    if git_sha(ROOT) is not None:  # a git checkout (CI is): the tag names one of its commits
        commit = sha.removesuffix("-dirty")
        assert subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=ROOT).returncode == 0, sha
    first_id = parent.data.tags["ragen2.instance"]
    assert parent.info.run_name == f"e2e/{first_id}"
    assert {r.data.tags["ragen2.instance"] for r in children} == {first_id}
    assert Path(by_arm["a"].data.tags["ragen2.output_dir"]).parent.parent == tmp_path / "runs" / "e2e" / first_id

    # the same command again starts a new instance: its own folder, parent run and trial runs
    again = sweep(tmp_path, spec, "--no-report")
    assert again.returncode == 1, again.stdout[-3000:] + again.stderr[-3000:]
    _, parents2, children2 = runs_of(uri, "e2e")
    assert len(parents2) == 2 and len(children2) == 6
    second = next(p for p in parents2 if p.info.run_id != parent.info.run_id)
    second_id = second.data.tags["ragen2.instance"]
    assert second_id != first_id and second.info.run_name == f"e2e/{second_id}"
    assert sorted(p.name for p in (tmp_path / "runs" / "e2e").iterdir()) == sorted([first_id, second_id])
    assert all((tmp_path / "runs" / "e2e" / i / "trials").is_dir() for i in (first_id, second_id))
    # reports read the latest instance unless told another
    assert collect(uri, "e2e").parent["tags"]["ragen2.instance"] == second_id
    assert collect(uri, "e2e", instance=first_id).parent["run_id"] == parent.info.run_id

    # --resume with a name continues that instance (not the latest): finished trials are not rerun,
    # no run is duplicated; the broken one is retried and fails again
    done = {arm: Path(by_arm[arm].data.tags["ragen2.output_dir"]) / "result.json" for arm in ("a", "ppo")}
    stamps = {arm: p.stat().st_mtime_ns for arm, p in done.items()}
    resumed = sweep(tmp_path, spec, "--resume", first_id, "--no-report")
    assert resumed.returncode == 1, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"resuming 'e2e' instance {first_id}" in resumed.stdout and "[sweep] start a-" not in resumed.stdout
    assert {arm: p.stat().st_mtime_ns for arm, p in done.items()} == stamps
    _, parents3, children3 = runs_of(uri, "e2e")
    assert sorted(p.info.run_id for p in parents3) == sorted(p.info.run_id for p in parents2)
    assert sorted(r.info.run_id for r in children3) == sorted(r.info.run_id for r in children2)
    for arm in ("a", "ppo"):
        assert len(client.get_metric_history(by_arm[arm].info.run_id, "rollout/success")) == 2

    # an instance that does not exist: refused, nothing started, the instances listed
    missing = sweep(tmp_path, spec, "--resume", "1999-01-01_00-00-00")
    assert missing.returncode == 2 and first_id in missing.stderr and second_id in missing.stderr
    assert len(runs_of(uri, "e2e")[1]) == 2


def test_a_restored_archive_resumes_where_runs_and_store_are_gone(tmp_path, cache):
    # The first machine: a two-trial sweep, archived with trial b marked unfinished, as an archive
    # taken while b still ran holds it. Then runs/ and mlflow.db go, as on a fresh machine.
    spec = write_spec(tmp_path, "moved", cache, arms={"a": {}, "b": {"algo.kl_coef": 0.01}})
    first = sweep(tmp_path, spec, "--no-report")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    # in processes of their own: this one must not hold the first machine's store open
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    script = lambda name, *args: subprocess.run(  # noqa: E731
        [sys.executable, str(ROOT / "reports" / f"{name}.py"), *args], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=300)
    assert script("archive", "moved", "--out", "saved").returncode == 0
    partial = tmp_path / "saved" / "moved.json.gz"
    before = load(partial)
    next(t for t in before.trials if t.arm == "b").status = "RUNNING"
    save(before, partial)
    shutil.rmtree(tmp_path / "runs")
    (tmp_path / "mlflow.db").unlink()
    shutil.rmtree(tmp_path / "mlruns", ignore_errors=True)

    restored = script("restore", str(partial))
    assert restored.returncode == 0, restored.stderr[-3000:]
    instance = before.parent["tags"]["ragen2.instance"]
    assert f"instance {instance}" in restored.stdout and "1 finished trials of 2 planned" in restored.stdout
    resumed = sweep(tmp_path, spec, "--resume", "--no-report")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"resuming 'moved' instance {instance}" in resumed.stdout
    assert "[sweep] start b-" in resumed.stdout and "[sweep] start a-" not in resumed.stdout

    after = collect(f"sqlite:///{tmp_path}/mlflow.db", "moved")
    assert len(after.trials) == 2 and {t.status for t in after.trials} == {"FINISHED"}
    assert after.parent["tags"]["ragen2.restored_from"] == "moved.json.gz"
    old_a, new_a = (next(t for t in s.trials if t.arm == "a") for s in (before, after))
    # restored, not rerun (compared as JSON, where a logged NaN equals itself)
    assert json.dumps(new_a.history, sort_keys=True) == json.dumps(old_a.history, sort_keys=True)
    assert new_a.params == old_a.params and new_a.run_id != old_a.run_id
    new_b = next(t for t in after.trials if t.arm == "b")
    assert new_b.curve("rollout/success")[0] == [1, 2] and new_b.curve("eval/success")[0] == [2]
    assert Path(new_b.tags["ragen2.output_dir"]).parent.parent == tmp_path / "runs" / "moved" / instance


@pytest.mark.slow
def test_kill_9_then_resume_logs_every_step_once(tmp_path, cache):
    # Enough steps that no trial can finish in the ~12 s between its second checkpoint and the kill
    # (a tiny-policy step takes well under a second).
    steps = 150
    # two at a time: c and d wait for a free worker
    arms = {"a": {}, "b": {"algo.kl_coef": 0.01}, "c": {"algo.kl_coef": 0.02}, "d": {"algo.kl_coef": 0.03}}
    # storage relative to the cwd, as users write it: Tune runs each trial in a folder of its own
    spec = write_spec(tmp_path, "killed", cache, arms=arms, storage="runs",
                      fixed={"train": {"eval_every": 10, "steps": steps, "checkpoint_every": 5}})
    env = os.environ | {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(RUN + [str(spec), "--progress-every", "2"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    sweep_root = tmp_path / "runs" / "killed"
    deadline = time.time() + 300
    while time.time() < deadline and len(list(sweep_root.glob("*/trials/*/checkpoints/step_*"))) < 2:
        time.sleep(1)
    time.sleep(12)  # past Tune's ~10 s experiment-state snapshot
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    # the driver's own Ray processes die with it only eventually; end the driver's process group
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    assert not list(sweep_root.glob("*/trials/*/result.json")), "trials finished before the kill; raise steps"
    # As if an older driver had started the instance: Tune restores its controller's saved state,
    # and that one handed a finished trial's worker the next trial.
    state = max(sweep_root.glob("*/experiment_state-*.json"))
    saved = json.loads(state.read_text())
    assert saved["runner_data"]["_reuse_actors"] is False
    saved["runner_data"]["_reuse_actors"] = True
    state.write_text(json.dumps(saved))
    resumed = sweep(tmp_path, spec, "--resume")  # the latest instance: the killed one
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    client, parents, children = runs_of(f"sqlite:///{tmp_path}/mlflow.db", "killed")
    assert len(parents) == 1 and len(children) == 4
    # the restored instance gives every trial its own worker all the same
    pids = worker_pids(sweep_root)
    assert len(pids) == 4 and len(set(pids.values())) == 4, f"trials shared a worker process: {pids}"
    for run in children:
        assert run.info.status == "FINISHED"
        history = [m.step for m in client.get_metric_history(run.info.run_id, "rollout/success")]
        assert sorted(history) == list(range(1, steps + 1))
        # each trial went on from its own checkpoints, in its own folder: a trial trained again from
        # step 0 elsewhere would still log every step once, but spliced from two runs
        assert run.data.tags["ragen2.stop_reason"] == "completed"
        out = Path(run.data.tags["ragen2.output_dir"])
        assert out.is_relative_to(sweep_root) and (out / "result.json").is_file()


@pytest.mark.slow
def test_optuna_sweep_runs(tmp_path, cache):
    spec = write_spec(tmp_path, "tuned", cache, metric="rollout/reward_mean",
                      search={"kind": "optuna", "samples": 3, "seed": 0,
                              "space": {"algo.kl_coef": {"loguniform": [1e-4, 1e-1]}}})
    proc = sweep(tmp_path, spec)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    client, parents, children = runs_of(f"sqlite:///{tmp_path}/mlflow.db", "tuned")
    assert len(children) == 3 and all(r.info.status == "FINISHED" for r in children)
    assert len({r.data.params["algo.kl_coef"] for r in children}) == 3
    # Three trials, two at a time: the third starts when a worker is free. It must get a fresh
    # process, not the finished trial's (a reused worker kept its memory: docs/sweeps.md).
    pids = worker_pids(tmp_path / "runs" / "tuned")
    assert len(pids) == 3 and len(set(pids.values())) == 3, f"trials shared a worker process: {pids}"


@pytest.mark.slow
def test_two_worker_trial_runs_data_parallel_under_torchtrainer(tmp_path, cache):
    # One trial of 2 workers x 1 CPU: TorchTrainer opens a gloo group, each worker rolls out its own
    # groups under DeepSpeed, rank 0's metrics reach Tune and MLflow like a one-process trial's.
    spec = write_spec(tmp_path, "ddp", cache, arms={"a": {}}, resources={"cpu": 1, "workers": 2}, max_concurrent=1)
    done = sweep(tmp_path, spec, "--no-report", timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    client, _, children = runs_of(f"sqlite:///{tmp_path}/mlflow.db", "ddp")
    assert len(children) == 1 and children[0].info.status == "FINISHED"
    run_id = children[0].info.run_id
    assert [m.step for m in client.get_metric_history(run_id, "rollout/success")] == [1, 2]
    assert [m.step for m in client.get_metric_history(run_id, "eval/success")] == [2]
    out = Path(children[0].data.tags["ragen2.output_dir"])
    assert (out / "policy").is_dir() and (out / "result.json").is_file()
