"""One training run's curves, read from its ``metrics.jsonl``, as one figure of small panels: for a
run outside any sweep (a real model's, a debugging run), where the sweep report has nothing to compare.

    python reports/run_curves.py runs/smollm2_frozenlake --out docs/figures/smollm2/grpo_run.png
    python reports/run_curves.py runs/x/metrics.jsonl --metrics rollout/success,collapse/mi --title "x, seed 0"
    python reports/run_curves.py docs/data/smollm2/grpo_run.metrics.jsonl.gz --windows 1,2-10,11-40   # a table, no figure

A resumed run appends the steps it replays after its checkpoint; the last record of a step wins,
as it is the one the run went on from. ``--windows`` prints instead each metric's mean over each
range of steps (a single step gives its reading), as a Markdown table. Exit status: 0 written; 2 no
such file, a metric it never logged, or a bad range.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from ragen2_core.tracking.sinks import JsonlSink

Curve = tuple[list[int], list[float]]
DEFAULT = ["rollout/success", "eval/success", "rollout/format_valid", "rollout/shared_think_frac",
           "rollout/template_frac", "collapse/mi", "actor/entropy", "rollout/frac_zero_std_groups"]
SHARES = ("success", "frac", "valid", "ratio")  # metrics in [0, 1], drawn on the whole of it


def read_curves(path: str | Path) -> dict[str, Curve]:
    """metric -> (steps, values), steps ascending, NaNs kept (a panel shows them as gaps)."""
    path = Path(path)
    path = path / "metrics.jsonl" if path.is_dir() else path
    by_step: dict[int, dict] = {}
    for rec in JsonlSink.read(path):
        if rec.get("type") == "metrics":
            by_step[rec["step"]] = rec["metrics"]
    curves: dict[str, Curve] = {}
    for step in sorted(by_step):
        for key, value in by_step[step].items():
            steps, values = curves.setdefault(key, ([], []))
            steps.append(step)
            values.append(float(value))
    return curves


def plot(curves: dict[str, Curve], metrics: list[str], out: str | Path, title: str = "") -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(4, len(metrics))
    rows = -(-len(metrics) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.4 * rows), squeeze=False)
    for ax, metric in zip(axes.flat, metrics):
        steps, values = curves[metric]
        few = sum(not math.isnan(v) for v in values) <= 5  # sparse readings (eval): mark each point
        ax.plot(steps, values, marker="o" if few else None, markersize=4, linewidth=1.2)
        if any(word in metric for word in SHARES):
            ax.set_ylim(-0.03, 1.03)  # a share reads against its whole range, not its own wiggle
        ax.set_title(metric, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(metrics):]:
        ax.axis("off")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def window_rows(curves: dict[str, Curve], metrics: list[str], windows: list[tuple[int, int]]) -> list[str]:
    """A Markdown table: one row per metric, one column per (first, last) step range, each cell the
    mean of the metric's logged values in it (NaNs left out; '-' where it logged none)."""
    names = [f"{a}" if a == b else f"{a}-{b}" for a, b in windows]
    rows = ["| metric | " + " | ".join(f"steps {n}" for n in names) + " |", "|" + " --- |" * (len(names) + 1)]
    for metric in metrics:
        cells = []
        for a, b in windows:
            vals = [v for s, v in zip(*curves[metric]) if a <= s <= b and not math.isnan(v)]
            cells.append(f"{sum(vals) / len(vals):.3f}" if vals else "-")
        rows.append(f"| `{metric}` | " + " | ".join(cells) + " |")
    return rows


def parse_windows(text: str) -> list[tuple[int, int]]:
    """'1,2-10,11-40' -> [(1, 1), (2, 10), (11, 40)]; ValueError naming the bad part."""
    out = []
    for part in text.split(","):
        a, _, b = part.strip().partition("-")
        if not a.isdigit() or (b and not b.isdigit()) or (b and int(b) < int(a)):
            raise ValueError(f"--windows: {part!r} is not a step or a range of steps like 2-10")
        out.append((int(a), int(b or a)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", help="a run's output folder, or its metrics.jsonl (or .jsonl.gz)")
    ap.add_argument("--out", help="the figure to write (.png or .pdf)")
    ap.add_argument("--windows", help="print each metric's mean over these step ranges instead, e.g. 1,2-10,11-40")
    ap.add_argument("--metrics", default=",".join(DEFAULT), help="comma-separated metric names (default: %(default)s)")
    ap.add_argument("--title", default="")
    args = ap.parse_args(argv)
    if bool(args.out) == bool(args.windows):
        ap.error("give --out FIG (a figure) or --windows RANGES (a table), one of them")
    try:
        windows = parse_windows(args.windows) if args.windows else None
    except ValueError as e:
        print(f"run_curves: {e}", file=sys.stderr)
        return 2
    source = Path(args.run) / "metrics.jsonl" if Path(args.run).is_dir() else Path(args.run)
    if not source.is_file():
        print(f"run_curves: no metrics file at {source}; pass a run's output folder (train.output_dir) "
              "or its metrics.jsonl", file=sys.stderr)
        return 2
    curves = read_curves(source)
    metrics = [m for m in args.metrics.split(",") if m]
    missing = [m for m in metrics if m not in curves]
    if missing:
        print(f"run_curves: --metrics {','.join(missing)}: never logged by this run; it logged "
              f"{len(curves)} metrics, e.g. {', '.join(sorted(curves)[:6])}", file=sys.stderr)
        return 2
    print("\n".join(window_rows(curves, metrics, windows)) if windows else plot(curves, metrics, args.out, args.title))
    return 0


if __name__ == "__main__":
    sys.exit(main())
