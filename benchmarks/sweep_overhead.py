"""Sweep orchestration cost: 4 trials through the orchestrator (Ray Tune, MLflow, max_concurrent 2)
vs the same 4 trainer runs one after another in this process, without Ray.

Both sides train exactly the trials of a small spec (2 arms x 2 seeds, 1 CPU thread each). The
orchestrated side is the real command, `python sweeps/run.py SPEC --no-report`, in a fresh process
(Ray start-up, MLflow writes and worker imports included). The last line is one JSON object with
``ratio`` = sequential wall time / orchestrated wall time (goal 1.7 on 2 cores: two trials at once
minus the orchestration cost) and ``overhead_per_trial_s`` = (orchestrated time - sequential time /
concurrency) / trials, the time each trial pays beyond perfect parallel scaling.

The profile above it splits the orchestrated time into its phases, read from the driver's output
as it comes (driver start-up and MLflow parent run; Ray start-up and Tune set-up up to the first
trial start; the trials; the summary and Ray shutdown after the last one), and measures the two
costs a sequential run does not pay: a worker's first import of the trainer (a fresh process), and
the slowdown of two trials training at once (two plain processes, no Ray) against one alone.

    python benchmarks/sweep_overhead.py [--steps 40] [--no-profile] [--set KEY=VALUE ...]
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
CONCURRENCY = 2


def write_spec(d: Path, steps: int, extra: dict) -> Path:
    spec = {"name": "overhead", "base": str(REPO / "sweeps/base/frozenlake_tiny.yaml"),
            "fixed": {"rollout.n_groups": 4, "rollout.group_size": 4, "rollout.max_new_tokens": 64,
                      "env.val_seeds": 8, "train.steps": steps, "train.eval_every": steps, "collapse.every": 2,
                      **extra},
            "arms": {"nofilter": "nofilter", "filter": "paper"}, "seeds": 2, "resources": {"cpu": 1},
            "max_concurrent": CONCURRENCY, "storage": str(d / "sweeps")}
    path = d / "overhead.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def trial_configs(spec_path: Path, out: str) -> list:
    from ragen2_core.config import load_config
    from ragen2_core.sweep.trials import load_spec

    spec, trials = load_spec(spec_path)
    return [load_config(spec.base_path, [o for o in t.overrides if not o.startswith("train.output_dir=")]
                        + [f"train.output_dir={spec_path.parent / out / t.trial_id}", "train.resume=false"])
            for t in trials]


def sequential(spec_path: Path) -> list[float]:
    """Seconds of each of the spec's trials, trained back to back here with the same threads."""
    from ragen2_core.tracking import MemorySink
    from ragen2_core.train.trainer import run

    from ragen2_core.policy.load import load_policy

    times = []
    cfgs = trial_configs(spec_path, "seq")
    load_policy(cfgs[0].policy, cfgs[0].warmstart, cfgs[0].env)  # a policy still to build is no trial's time
    for cfg in cfgs:
        t0 = time.perf_counter()
        run(cfg, MemorySink())
        times.append(time.perf_counter() - t0)
    return times


def orchestrated(spec_path: Path) -> tuple[float, dict]:
    """Wall time of the sweep command, and when its phases ended (seconds from its start)."""
    marks: dict = {"starts": [], "ends": []}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, str(REPO / "sweeps/run.py"), str(spec_path), "--no-report",
                             "--progress-every", "3600", "--tracking-uri", f"sqlite:///{spec_path.parent / 'mlflow.db'}"],
                            cwd=spec_path.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:
        now = time.perf_counter() - t0
        lines.append(line)
        if line.startswith("sweep: 'overhead' instance"):
            marks["parent"] = now
        elif line.startswith("[sweep] start "):
            marks["starts"].append(now)
        elif line.startswith("[sweep] done ") or line.startswith("[sweep] failed "):
            marks["ends"].append(now)
    total = time.perf_counter() - t0
    if proc.wait() != 0:
        raise SystemExit(f"orchestrated sweep failed ({proc.returncode}):\n{''.join(lines)[-3000:]}")
    return total, marks


def fresh_import_s() -> float:
    """A worker's first import of the trainer: a fresh interpreter, timed inside it."""
    code = ("import time; t = time.perf_counter(); import ragen2_core.train.trainer; "
            "print(time.perf_counter() - t)")
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                cwd=REPO).stdout.split()[-1])


def two_at_once(spec_path: Path) -> list[float]:
    """Training seconds of the first two trials run by two plain processes at the same time (imports
    and policy load are outside the timing, as they are for the sequential side)."""
    code = ("import sys, time, pickle; from ragen2_core.train.trainer import run; "
            "from ragen2_core.tracking import MemorySink; from ragen2_core.policy.load import load_policy; "
            "cfg = pickle.load(open(sys.argv[1], 'rb')); load_policy(cfg.policy, cfg.warmstart, cfg.env); "
            "open(sys.argv[2], 'w').close()\n"
            "import os\nwhile not os.path.exists(sys.argv[3]): time.sleep(0.05)\n"
            "t = time.perf_counter(); run(cfg, MemorySink()); print(time.perf_counter() - t)")
    import pickle
    d = spec_path.parent
    procs = []
    for i, cfg in enumerate(trial_configs(spec_path, "pair")[:CONCURRENCY]):
        (d / f"cfg{i}.pkl").write_bytes(pickle.dumps(cfg))
        procs.append(subprocess.Popen([sys.executable, "-c", code, str(d / f"cfg{i}.pkl"), str(d / f"ready{i}"),
                                       str(d / "go")], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                      env=os.environ | {"PYTHONPATH": str(REPO)}))
    while not all((d / f"ready{i}").exists() for i in range(CONCURRENCY)):  # both imported: start together
        if any(p.poll() not in (None, 0) for p in procs):
            raise SystemExit("a training process of the concurrency measurement failed")
        time.sleep(0.05)
    (d / "go").touch()
    return [float(p.communicate()[0].split()[-1]) for p in procs]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--no-profile", action="store_true", help="only the ratio (skips the two extra measurements)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="another fixed override of the trials, e.g. policy.hidden_size=32")
    a = ap.parse_args()
    importlib.import_module("ragen2_core.train.trainer")  # warm imports for the sequential side, as for a user
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as d:
        extra = {k: yaml.safe_load(v) for k, _, v in (o.partition("=") for o in a.set)}
        spec = write_spec(Path(d), a.steps, extra)
        seq_times = sequential(spec)
        orch, marks = orchestrated(spec)
        pair = None if a.no_profile else two_at_once(spec)
        imp = None if a.no_profile else fresh_import_s()
    seq, n = sum(seq_times), len(seq_times)
    alone = sum(seq_times[:CONCURRENCY]) / CONCURRENCY
    print(f"sequential (no Ray): {seq:7.1f} s for {n} trials ({', '.join(f'{t:.1f}' for t in seq_times)})")
    print(f"orchestrated (Tune, MLflow, {CONCURRENCY} at a time): {orch:7.1f} s")
    phases = {}
    if marks.get("parent") is not None and marks["starts"] and len(marks["ends"]) == n:
        phases = {"driver_startup_s": marks["parent"], "ray_startup_to_first_trial_s": marks["starts"][0] - marks["parent"],
                  "trials_s": marks["ends"][-1] - marks["starts"][0], "after_last_trial_s": orch - marks["ends"][-1]}
        print("  " + "; ".join(f"{k[:-2].replace('_', ' ')} {v:.1f} s" for k, v in phases.items()))
    if pair:
        print(f"worker's first import of the trainer (fresh process): {imp:.1f} s")
        print(f"two trials at once, no Ray: {', '.join(f'{t:.1f}' for t in pair)} s vs {alone:.1f} s alone "
              f"(slowdown {sum(pair) / len(pair) / alone - 1:+.0%})")
    print(json.dumps({"name": "sweep_overhead", "ratio": round(seq / orch, 2), "goal": 1.7, "trials": n,
                      "steps": a.steps, "sequential_s": round(seq, 1), "orchestrated_s": round(orch, 1),
                      "overhead_per_trial_s": round((orch - seq / CONCURRENCY) / n, 1),
                      **{k: round(v, 1) for k, v in phases.items()},
                      **({"first_import_s": round(imp, 1), "concurrent_slowdown": round(sum(pair) / len(pair) / alone - 1, 3)}
                         if pair else {}),
                      "load_avg_1min_at_start": round(load, 2)}))


if __name__ == "__main__":
    main()
