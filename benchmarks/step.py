"""Where a training step's time goes, and what a setting changes: a baseline against variants.

Each variant is the base config plus its overrides, trained for ``--steps`` steps in this process
(validation, MI proxy and gradient probe off, so the step is rollout + update); the first step is
left out as warm-up. Runs alternate baseline / variant ``--repeats`` times, so the machine's load
drifts through both alike. Prints seconds per step for the rollout, the update and the whole step,
and the ratio baseline / variant (above 1: the variant is faster). The last line is one JSON object.

    python benchmarks/step.py --config sweeps/base/doors.yaml \\
        --base algo.advantage=gae algo.loss_agg=token-mean algo.mini_batches=4 \\
        --variant train.grad_accum=1 [--variant ...] [--steps 4] [--repeats 2] [--threads 1]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ragen2_core.config import ConfigError, load_config  # noqa: E402
from ragen2_core.tracking import MemorySink  # noqa: E402

QUIET = ["train.eval_every=0", "collapse.every=0", "grad_probe.every=0", "train.checkpoint_every=0"]
KEYS = ("time/rollout_s", "time/update_s", "time/step_s")


def timed(config: str, overrides: list[str], steps: int, threads: int) -> dict[str, float]:
    from ragen2_core.train.trainer import run
    with tempfile.TemporaryDirectory() as out:
        cfg = load_config(config, [*QUIET, *overrides, f"train.steps={steps}", f"train.threads={threads}",
                                   f"train.output_dir={out}"])
        sink = MemorySink()
        run(cfg, sink)
    rows = [m for _, m in sink.metrics][1:]  # the first step pays for lazy initialisation
    return {k: statistics.fmean(r[k] for r in rows) for k in KEYS}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="sweeps/base/doors.yaml")
    ap.add_argument("--base", nargs="*", default=[], metavar="KEY=VALUE", help="overrides of the baseline")
    ap.add_argument("--variant", action="append", nargs="+", default=[], metavar="KEY=VALUE",
                    help="overrides on top of the baseline's (repeat the flag for several variants)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    if args.steps < 2 or args.repeats < 1 or args.threads < 1:
        print("--steps must be >= 2 (the first is warm-up), --repeats and --threads >= 1", file=sys.stderr)
        return 2
    runs = {"baseline": args.base, **{" ".join(v): [*args.base, *v] for v in args.variant}}
    try:
        for overrides in runs.values():
            load_config(args.config, overrides)
    except ConfigError as e:
        print(e, file=sys.stderr)
        return 2
    times: dict[str, list[dict]] = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, overrides in runs.items():
            times[name].append(timed(args.config, overrides, args.steps, args.threads))
    mean = {name: {k: statistics.fmean(t[k] for t in ts) for k in KEYS} for name, ts in times.items()}
    base = mean["baseline"]
    print(f"{'run':40s} {'rollout s':>10s} {'update s':>10s} {'step s':>10s} {'ratio':>7s}")
    for name, m in mean.items():
        print(f"{name[:40]:40s} {m[KEYS[0]]:10.2f} {m[KEYS[1]]:10.2f} {m[KEYS[2]]:10.2f} "
              f"{base[KEYS[2]] / m[KEYS[2]]:7.2f}")
    print(json.dumps({"config": args.config, "base": args.base, "steps": args.steps, "repeats": args.repeats,
                      "threads": args.threads, "seconds_per_step": mean,
                      "ratio": {n: base[KEYS[2]] / m[KEYS[2]] for n, m in mean.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
