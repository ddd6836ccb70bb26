"""Sweep orchestration cost: 4 short trials through the orchestrator (Ray Tune, MLflow, max_concurrent 2)
vs the same 4 trainer runs one after another in this process, without Ray.

Both sides train exactly the trials of a small spec (2 arms x 2 seeds, 1 CPU thread each). The
orchestrated side is the real command, `python sweeps/run.py SPEC --no-report`, in a fresh process
(Ray start-up, MLflow writes and worker imports included). The last line is one JSON object with
``ratio`` = sequential wall time / orchestrated wall time (goal 1.7 on 2 cores: two trials at once
minus the orchestration cost) and ``overhead_per_trial_s`` = (orchestrated time - sequential time /
concurrency) / trials, the time each trial pays beyond perfect parallel scaling.

    python benchmarks/sweep_overhead.py [--steps 4]
"""
from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
CONCURRENCY = 2


def write_spec(d: Path, steps: int) -> Path:
    spec = {"name": "overhead", "base": str(REPO / "sweeps/base/frozenlake_tiny.yaml"),
            "fixed": {"rollout.n_groups": 4, "rollout.group_size": 4, "rollout.max_new_tokens": 64,
                      "env.val_seeds": 8, "train.steps": steps, "train.eval_every": steps, "collapse.every": 2},
            "arms": {"nofilter": "nofilter", "filter": "paper"}, "seeds": 2, "resources": {"cpu": 1},
            "max_concurrent": CONCURRENCY, "storage": str(d / "sweeps")}
    path = d / "overhead.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def sequential(spec_path: Path) -> float:
    """The spec's trials, trained back to back here with the same per-trial threads."""
    from ragen2_core.config import load_config
    from ragen2_core.sweep.trials import load_spec
    from ragen2_core.tracking import MemorySink
    from ragen2_core.train.trainer import run

    spec, trials = load_spec(spec_path)
    t0 = time.perf_counter()
    for t in trials:
        cfg = load_config(spec.base_path, [o for o in t.overrides if not o.startswith("train.output_dir=")]
                          + [f"train.output_dir={spec_path.parent / 'seq' / t.trial_id}", "train.resume=false"])
        run(cfg, MemorySink())
    return time.perf_counter() - t0


def orchestrated(spec_path: Path) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(REPO / "sweeps/run.py"), str(spec_path), "--no-report",
                           "--tracking-uri", f"sqlite:///{spec_path.parent / 'mlflow.db'}"],
                          cwd=spec_path.parent, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"orchestrated sweep failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=4)
    a = ap.parse_args()
    importlib.import_module("ragen2_core.train.trainer")  # warm imports for the sequential side, as for a user
    with tempfile.TemporaryDirectory() as d:
        spec = write_spec(Path(d), a.steps)
        seq = sequential(spec)
        orch = orchestrated(spec)
    n = 4
    print(f"sequential (no Ray): {seq:7.1f} s for {n} trials")
    print(f"orchestrated (Tune, MLflow, {CONCURRENCY} at a time): {orch:7.1f} s")
    print(json.dumps({"name": "sweep_overhead", "ratio": round(seq / orch, 2), "goal": 1.7, "trials": n,
                      "steps": a.steps, "sequential_s": round(seq, 1), "orchestrated_s": round(orch, 1),
                      "overhead_per_trial_s": round((orch - seq / CONCURRENCY) / n, 1)}))


if __name__ == "__main__":
    main()
