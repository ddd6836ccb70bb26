"""Build the comparative PDF report of one sweep, with its tables as CSV and JSON beside it.

    ragen2 report --experiment kl_vs_filter [--instance ID] [--tracking-uri URI] [--out reports/out/kl_vs_filter.pdf]
                  [--baseline nofilter] [--include-running] [--png-dir docs/figures]
    python reports/build.py --experiment kl_vs_filter                  # the same
    ragen2 report --archive docs/data/doors/filter_vs_nofilter.json.gz # from a saved sweep (report/archive.py)

    from ragen2_core.report.build import build_report, build
    pdf = build_report(tracking_uri, "kl_vs_filter", "reports/out/kl_vs_filter.pdf")   # -> Path
    pdf, summary = build(tracking_uri, "kl_vs_filter", out)          # summary: the main table and more

Writes <out>.pdf, <stem>.json (summary) and <stem>.<table>.csv for table, comparisons, predictors,
cost and trials. The sweep's latest instance is reported unless --instance names another.
Exit status: 0 built; 2 unknown experiment or instance (the message lists those that exist), or a bad
--tracking-uri or --out (not writable, inside git, not named .pdf).
"""
from __future__ import annotations

import argparse
import csv
import datetime as dt
import io
import json
import math
import os
import re
import sys
from importlib import metadata
from pathlib import Path
from typing import Optional

import matplotlib
from matplotlib.backends.backend_pdf import PdfPages

from ragen2_core.atomic import write_text_atomic
from ragen2_core.report import figures, filter_figures, monitor_figures
from ragen2_core.report.analysis import SUCCESS, analyse, usable
from ragen2_core.report.archive import SUFFIX, BadArchive, is_archive, open_sweep
from ragen2_core.report.collect import Sweep, UnknownExperiment, eval_samples, first_thinks

EXIT_OK, EXIT_BAD_INPUT = 0, 2


# ----------------------------------------------------------------------------- provenance

def question(spec_text: str) -> str:
    """The '# Question:' comment of the spec, with its continuation lines (up to '# Run:' etc.)."""
    out, on = [], False
    for line in spec_text.splitlines():
        if not line.startswith("#"):
            if on:
                break
            continue
        body = line.lstrip("#").strip()
        if body.lower().startswith("question:"):
            on, body = True, body[len("question:"):].strip()
        elif on and re.match(r"^[A-Z][A-Za-z ]{0,20}:\s", body):
            break  # the next labelled comment (Run:, Expected:)
        if on:
            out.append(body)
    return " ".join(out)


def _date(ms: Optional[int]) -> str:
    return dt.datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M") if ms else "?"


def _version(pkg: str) -> str:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return "?"


def provenance(sweep: Sweep) -> dict:
    ts = sweep.trials
    status = {s: sum(t.status == s for t in ts) for s in ("FINISHED", "FAILED", "RUNNING", "KILLED")}
    planned = max(len(sweep.expected), len(ts))
    counts = (f"{planned} planned: {status['FINISHED']} finished, {status['FAILED']} failed, {status['RUNNING']} running"
              + (f", {status['KILLED']} killed" if status["KILLED"] else "") + f", {planned - len(ts)} not started")
    shas = sorted({t.tags.get("ragen2.git_sha", "unknown") for t in ts}
                  | ({sweep.parent["tags"].get("ragen2.git_sha", "unknown")} if sweep.parent else set()))
    hashes = sorted({t.tags.get("ragen2.config_hash") for t in ts} - {None})
    versions = {k: sorted({t.tags.get(f"ragen2.{k}") for t in ts} - {None}) for k in
                ("python", "torch", "transformers", "deepspeed")}
    trained = ", ".join(f"{k} {'/'.join(v)}" for k, v in versions.items() if v) or "not recorded"
    here = ", ".join(f"{p} {_version(p)}" for p in ("numpy", "scipy", "matplotlib", "mlflow"))
    starts = [t.start_ms for t in ts if t.start_ms]
    ends = [t.end_ms for t in ts if t.end_ms]
    instance = sweep.parent["tags"].get("ragen2.instance") if sweep.parent else None
    sweep_dates = ((f"instance {instance}: " if instance else "")
                   + f"sweep run {_date(sweep.parent['start_ms'])} to {_date(sweep.parent['end_ms'])} "
                   f"({sweep.parent['status']}); " if sweep.parent else "")
    return {"question": question(sweep.spec_text), "counts": counts, "git": ", ".join(shas) or "unknown",
            "hashes": f"{len(hashes)} distinct over {len(ts)} trials"
                      + (f" ({', '.join(hashes[:8])}{', ...' if len(hashes) > 8 else ''})" if hashes else ""),
            "versions": f"trained with {trained}; report built with {here}",
            "dates": sweep_dates + (f"trials {_date(min(starts))} to {_date(max(ends)) if ends else 'now'}"
                                    if starts else "no trial started"),
            "built": dt.datetime.now().strftime("%Y-%m-%d %H:%M")}


# ----------------------------------------------------------------------------- collapse examples

def examples(sweep: Sweep, result: dict, limit: int = 3) -> list[dict]:
    """First-turn reasoning of the best and the worst cell, earliest vs latest eval, same seeds."""
    scored = [r for r in result["table"] if r["success_value"] is not None]
    if not scored:
        return []
    best = max(scored, key=lambda r: r["success_value"])
    worst = min(scored, key=lambda r: r["success_value"])
    out = []
    for which, row in (("best", best), ("worst", worst)) if best is not worst else (("only", best),):
        ex = {"which": which, "arm": row["arm"], "condition": row["condition"], "success": row["success_value"],
              "trial_id": "-", "seed": "-", "early": "-", "late": "-", "n": 0, "distinct_early": 0, "distinct_late": 0}
        trials = sorted((t for t in sweep.cell(row["arm"], row["condition"]) if usable(t, result["include_running"])),
                        key=lambda t: t.seed)
        for t in trials:
            samples = eval_samples(sweep, t)
            if len(samples) >= 2:
                break
        else:
            out.append(ex | {"missing": "no trial of this cell logged validation samples at two or more steps."})
            continue
        early, late = min(samples), max(samples)
        a, b = first_thinks(samples[early]), first_thinks(samples[late])
        common = [s for s in a if s in b]
        ex |= {"trial_id": t.trial_id, "seed": t.seed, "early": early, "late": late, "n": len(common),
               "distinct_early": len({a[s]["think"] for s in common}), "distinct_late": len({b[s]["think"] for s in common}),
               "seeds": common[:limit], "early_text": a, "late_text": b}
        if not common:
            ex["missing"] = "the early and late sample files share no validation seed."
        out.append(ex)
    return out


# ----------------------------------------------------------------------------- files

def _plain(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None  # JSON has no NaN; a missing number is null
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if hasattr(v, "tolist"):
        return _plain(v.tolist())
    return v


def write_csv(path: Path, rows: list[dict]) -> None:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    buf = io.StringIO(newline="")
    w = csv.DictWriter(buf, fieldnames=keys)
    w.writeheader()
    for r in rows:
        w.writerow({k: "" if r.get(k) is None else r[k] for k in keys})  # empty cell, never "nan"
    write_text_atomic(path, buf.getvalue())


def trial_rows(sweep: Sweep) -> list[dict]:
    return [{"trial_id": t.trial_id, "arm": t.arm, "condition": t.condition, "seed": t.seed, "status": t.status,
             "stop_reason": t.stop_reason, "last_step": t.last_step(), "run_id": t.run_id,
             **{f"final {m}": _plain(t.final(m)) for m in t.history}, "missing": " ".join(t.missing)}
            for t in sweep.trials]


# ----------------------------------------------------------------------------- the build

def build(tracking_uri: str, experiment: str, out_path: str | Path, baseline: Optional[str] = None,
          include_running: bool = False, png_dir: str | Path | None = None,
          instance: Optional[str] = None) -> tuple[Path, dict]:
    """Collect, analyse, draw; returns the PDF path and the summary written beside it as JSON.
    ``experiment`` is an MLflow experiment or a sweep archive (``*.json.gz``, report/archive.py).
    With ``png_dir`` every page is also saved there as a small PNG (``<experiment>-pNN.png``), for
    documents that show a report's figures."""
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    sweep = open_sweep(experiment, tracking_uri, instance=instance)
    experiment = sweep.experiment
    if baseline is None and "nofilter" in sweep.arms:
        baseline = "nofilter"
    if baseline is not None and baseline not in sweep.arms:
        raise ValueError(f"--baseline {baseline!r} is not an arm of sweep {experiment!r}; arms: {', '.join(sweep.arms)}")
    result = analyse(sweep, baseline, include_running)
    prov = provenance(sweep)
    pages = (figures.title_page(sweep, result, prov) + figures.table_pages(result) + figures.curve_pages(sweep)
             + filter_figures.filter_pages(sweep) + figures.dose_pages(result, sweep.arms) + figures.comparison_pages(result)
             + figures.predictor_pages(result, sweep.arms) + figures.example_pages(examples(sweep, result))
             + monitor_figures.monitor_pages(sweep) + figures.cost_pages(sweep, result)
             + figures.robust_pages(sweep, result))
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".tmp-{out.name}")  # renamed into place once whole, like every file here
    with matplotlib.rc_context({"pdf.fonttype": 42}):  # TrueType: the PDF's text can be selected and searched
        with PdfPages(tmp, metadata={"Title": f"ragen2 sweep report: {experiment}", "Subject": prov["question"]}) as pdf:
            for fig in pages:
                pdf.savefig(fig)
    os.replace(tmp, out)
    if png_dir is not None:
        save_pngs(pages, Path(png_dir), experiment)
    stem = out.with_suffix("")
    tables = {"table": result["table"], "comparisons": result["comparisons"], "cost": result["cost"],
              "predictors": [{k: v for k, v in r.items() if k != "points"} for r in result["predictors"]],
              "trials": trial_rows(sweep)}
    for name, rows in tables.items():
        write_csv(Path(f"{stem}.{name}.csv"), _plain(rows))
    summary = _plain({"experiment": experiment, "pdf": str(out), "pages": len(pages), "baseline": baseline,
                      "seeds": result["seeds"], "notes": sweep.notes, "provenance": prov, **tables,
                      "iqm": result["robust"]["iqm"], "probability_of_improvement": result["robust"]["poi"]})
    write_text_atomic(Path(f"{stem}.json"), json.dumps(summary, indent=1, allow_nan=False))
    return out, summary


def save_pngs(pages, png_dir: Path, experiment: str, dpi: int = 60) -> None:
    png_dir.mkdir(parents=True, exist_ok=True)
    for i, fig in enumerate(pages, 1):
        final = png_dir / f"{experiment}-p{i:02d}.png"
        tmp = final.with_name(f".tmp-{final.name}")
        fig.savefig(tmp, dpi=dpi, format="png")
        os.replace(tmp, final)


def build_report(tracking_uri: str, experiment: str, out_path: str | Path, instance: Optional[str] = None) -> Path:
    """For the sweep driver: build and return the PDF path."""
    return build(tracking_uri, experiment, out_path, instance=instance)[0]


# ----------------------------------------------------------------------------- command line

def add_arguments(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--experiment", help="MLflow experiment of the sweep (its spec name)")
    which.add_argument("--archive", help="a sweep archive (*.json.gz, python reports/archive.py) instead of a store")
    parser.add_argument("--instance", help="sweep instance to report, e.g. 2026-12-03_20-05-11 (default: the latest)")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else ./mlflow.db)")
    parser.add_argument("--out", help="PDF path (default: reports/out/<experiment>.pdf)")
    parser.add_argument("--baseline", help="arm every other arm is compared with (default: nofilter, if present)")
    parser.add_argument("--png-dir", help="also save every page as a small PNG in this folder")
    parser.add_argument("--include-running", action="store_true",
                        help="count running trials with their latest values (marked provisional)")


def store_problem(uri: str) -> str | None:
    """Why ``uri`` is not a readable MLflow store (None when it looks like one, or is a server)."""
    import sqlite3
    from urllib.parse import urlparse

    fix = "pass --tracking-uri of the store the sweep wrote to (e.g. sqlite:////abs/path/mlflow.db)"
    if uri.startswith("sqlite:///"):
        path = Path(uri[len("sqlite:///"):])
        if not path.is_file():
            return f"no MLflow store at {path} (from {uri}); {fix}"
        try:
            con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            try:
                tables = {r[0] for r in con.execute("select name from sqlite_master where type='table'")}
            finally:
                con.close()
        except sqlite3.DatabaseError as e:
            return f"{path} is not a readable SQLite database ({e}); it is corrupt or not an MLflow store; {fix}"
        if "experiments" not in tables:
            return f"{path} is an SQLite database but not an MLflow store (no experiments table); {fix}"
        return None
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        path = Path(parsed.path if parsed.scheme else uri)
        if not path.is_dir():
            return f"no MLflow store directory at {path} (from {uri}); {fix}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ragen2 report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args(argv)
    from ragen2_core.tracking.mlflow_sink import default_tracking_uri
    uri = args.tracking_uri or default_tracking_uri()
    if args.archive is not None and not is_archive(args.archive):
        print(f"report: --archive {args.archive!r} is not a sweep archive (*.json.gz); write one with "
              "`python reports/archive.py EXPERIMENT --out DIR`", file=sys.stderr)
        return EXIT_BAD_INPUT
    ref = args.archive or args.experiment
    name = Path(ref).name[:-len(SUFFIX)] if args.archive else ref
    out = args.out or f"reports/out/{name}.pdf"
    from ragen2_core.train.preflight import report_problems
    # Checked before MLflow opens the store (opening a missing one creates it) or anything is written.
    problems = report_problems(uri, {"--out": args.out, "--png-dir": args.png_dir})
    problems += [] if args.archive else [p for p in [store_problem(uri)] if p]
    if problems:
        print("\n".join(f"report: {p}" for p in problems), file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        pdf, summary = build(uri, ref, out, args.baseline, args.include_running, args.png_dir,
                             instance=args.instance)
    except (UnknownExperiment, BadArchive, ValueError) as err:
        print(f"report: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    best = [r for r in summary["table"] if r["best"]]
    print(f"report: {pdf} ({summary['pages']} pages); tables beside it as {Path(out).stem}.*.csv and .json")
    if best:
        r = best[0]
        print(f"best cell: {r['arm']} | {r['condition']}: final {SUCCESS} {figures.fci(figures.stats.Estimate(r['success_value'], r['success_low'], r['success_high'], r['n'], ''))} (n={r['n_text']})")
    return EXIT_OK
