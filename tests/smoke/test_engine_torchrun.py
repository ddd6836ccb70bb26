"""Two CPU ranks under torchrun stay in sync and average their gradients.

    python3 -m pytest tests/smoke/test_engine_torchrun.py -q -m slow
"""
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("_engine_worker.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(cmd: list[str]) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)  # an in-process engine test may have set these for itself
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


@pytest.mark.slow
def test_two_ranks_train_in_sync(tmp_path):
    _run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
          "--master_port", str(_free_port()), str(WORKER), str(tmp_path)])
    _run([sys.executable, str(WORKER), str(tmp_path), "--reference"])
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    reference = torch.load(tmp_path / "reference.pt")

    assert [r["world_size"] for r in ranks] == [2, 2]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert torch.equal(ranks[0]["final"], ranks[1]["final"])
    assert not torch.equal(ranks[0]["final"], ranks[0]["initial"])
    # Equal shards: the mean of the two ranks' gradients is the whole-batch gradient.
    assert reference["world_size"] == 1
    torch.testing.assert_close(ranks[0]["final"], reference["final"], rtol=0, atol=1e-5)
