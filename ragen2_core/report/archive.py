"""A sweep as one file: what `collect` reads from MLflow (trials, curves, spec, validation samples),
saved so that reports and study tables can be rebuilt where the store is not: another machine, a
later day, a reader of docs/reproduction.md.

    python reports/archive.py filter_vs_nofilter --out docs/data/doors   # -> docs/data/doors/filter_vs_nofilter.json.gz
    ragen2 report --archive docs/data/doors/filter_vs_nofilter.json.gz   # the same PDF as from the store
    python reports/study.py docs/data/doors/*.json.gz                    # sweep names and archives mix

    from ragen2_core.report.archive import open_sweep
    sweep = open_sweep("filter_vs_nofilter", uri)          # MLflow experiment: its latest instance
    sweep = open_sweep("docs/data/doors/x.json.gz", uri)   # an archive (uri unused)

The file is gzipped JSON with a format number; curves are stored per step as `collect` deduplicated
them, so an archive holds exactly what a report reads and nothing it does not (no checkpoints, no
training samples, only the validation sample files the report's examples page quotes).
"""
from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path
from typing import Optional

from ragen2_core.atomic import write_bytes_atomic
from ragen2_core.report.collect import Sweep, Trial, UnknownExperiment, collect, eval_samples

FORMAT = 1
SUFFIX = ".json.gz"


class BadArchive(ValueError):
    pass


def is_archive(ref: str) -> bool:
    return str(ref).endswith(SUFFIX)


def _body(sweep: Sweep) -> dict:
    samples = sweep.samples if sweep.samples is not None else {t.run_id: eval_samples(sweep, t) for t in sweep.trials}
    return dataclasses.asdict(sweep) | {"samples": {rid: {str(k): v for k, v in by_step.items()}
                                                    for rid, by_step in samples.items()}}


def save(sweep: Sweep, path: str | Path) -> Path:
    """Write ``sweep`` (with every trial's validation samples, fetched now if not held) to ``path``."""
    doc = {"format": FORMAT, "kind": "ragen2 sweep archive", "sweep": _body(sweep)}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # mtime=0: the same sweep gives the same bytes, so a re-export shows no spurious git change
    write_bytes_atomic(path, gzip.compress(json.dumps(doc, sort_keys=True).encode(), mtime=0))
    return path


def same_content(a: Sweep, b: Sweep) -> bool:
    """Whether two sweeps hold the same trials, curves, samples and spec (notes aside). Compared as
    canonical JSON, where a logged NaN equals itself (as Python's == would not have it)."""
    def canon(sweep):
        body = _body(sweep)
        body.pop("notes")
        return json.dumps(body, sort_keys=True)
    return canon(a) == canon(b)


def load(path: str | Path) -> Sweep:
    path = Path(path)
    if not path.is_file():
        raise UnknownExperiment(f"no sweep archive at {path}; write one with `python reports/archive.py "
                                "EXPERIMENT --out DIR`, or name an MLflow experiment instead of a file.")
    try:
        doc = json.loads(gzip.decompress(path.read_bytes()))
    except (OSError, ValueError) as err:
        raise BadArchive(f"{path} is not a gzipped JSON sweep archive ({err}); rewrite it with "
                         "`python reports/archive.py EXPERIMENT --out DIR`.") from err
    if not isinstance(doc, dict) or doc.get("kind") != "ragen2 sweep archive":
        raise BadArchive(f"{path} is JSON but not a ragen2 sweep archive (no kind 'ragen2 sweep archive').")
    if doc.get("format") != FORMAT:
        raise BadArchive(f"{path} has archive format {doc.get('format')!r}; this ragen2 reads format {FORMAT}. "
                         "Rewrite it from its MLflow store with this version's reports/archive.py.")
    body = dict(doc["sweep"])
    trials = []
    for t in body.pop("trials"):
        history = {m: (list(steps), list(values)) for m, (steps, values) in t.pop("history").items()}
        trials.append(Trial(**t, history=history))
    samples = {rid: {int(k): v for k, v in by_step.items()} for rid, by_step in body.pop("samples").items()}
    notes = list(body.pop("notes")) + [f"read from the archive {path.name}, not from an MLflow store."]
    return Sweep(**body, trials=trials, notes=notes, samples=samples)


def open_sweep(ref: str, tracking_uri: str, instance: Optional[str] = None) -> Sweep:
    """An archive file when ``ref`` ends in .json.gz, else the MLflow experiment named ``ref``."""
    if is_archive(ref):
        if instance is not None:
            raise ValueError(f"--instance {instance!r} applies to MLflow experiments; the archive {ref} "
                             "holds one instance already. Leave --instance out.")
        return load(ref)
    return collect(tracking_uri, ref, instance=instance)
