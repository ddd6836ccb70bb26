"""`ragen2 train` under torchrun with 2 CPU ranks: one MLflow run, rank-distinct rollouts, one export."""
import json
import os
import socket
import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient

from test_train import TINY


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_rank_training_run(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    sets = TINY + [f"policy.cache_dir={tmp_path}/cache", f"train.output_dir={tmp_path}/run", "train.steps=2",
                   "train.checkpoint_every=2", "tracking.experiment=ddp"]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
           str(free_port()), "-m", "ragen2_core.cli", "train", "--tracking-uri", uri,
           *sum((["--set", o] for o in sets), [])]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # Build the cached policy once before the ranks start (they would wait on its lock anyway).
    subprocess.run([sys.executable, "-m", "ragen2_core.cli", "warmstart", *sum((["--set", o] for o in sets), [])],
                   check=True, timeout=600, env=env, capture_output=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    runs = MlflowClient(uri).search_runs([MlflowClient(uri).get_experiment_by_name("ddp").experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert (tmp_path / "run" / "policy" / "model.safetensors").exists()
    assert (tmp_path / "run" / "checkpoints" / "step_000001").exists()
    run_id = json.loads((tmp_path / "run" / "mlflow_run.json").read_text())["run_id"]
    assert run_id == runs[0].info.run_id


@pytest.mark.slow
def test_a_rank_whose_filter_kept_nothing_still_joins_the_update(tmp_path):
    # Rank 0 keeps both groups, rank 1 none (the filter is swapped in the worker). Rank 1 must take
    # part in each step's gradient all-reduce at zero weight: the run finishes (no hang) and both
    # ranks end with the same, moved parameters.
    from pathlib import Path
    worker = Path(__file__).with_name("_uneven_filter_worker.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    sets = TINY + [f"policy.cache_dir={tmp_path}/cache"]
    subprocess.run([sys.executable, "-m", "ragen2_core.cli", "warmstart", *sum((["--set", o] for o in sets), [])],
                   check=True, timeout=600, env=env, capture_output=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
           str(free_port()), str(worker), str(tmp_path), f"{tmp_path}/cache"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["kept"] == [2, 2] and r1["kept"] == [0, 0]
    assert r0["steps_done"] == r1["steps_done"] == 2 and r0["stop_reason"] == "completed"
    assert r0["end"] == pytest.approx(r1["end"], rel=1e-9) and r0["end"] != r0["start"]
