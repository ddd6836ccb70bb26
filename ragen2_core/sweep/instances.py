"""Sweep instances: every plain run of a spec is a new instance of the sweep, with its own folder
(<storage>/<name>/<instance>/) and its own MLflow parent run (named <name>/<instance>, tagged
`ragen2.instance`); `--resume` continues the latest instance or a named one.

    instance = new_instance(spec)          # claims a folder named by the UTC start time, e.g. 2026-12-03_20-05-11
    known = known_instances(spec, parents) # instance -> its parent run (None when this store has none), oldest first
    pick(known, LATEST)                    # the newest instance id

An instance is named by its start time, as Hydra names a multirun's folder, so names sort in start
order and say when the sweep ran; a second start within the same second gets a suffix (-2, -3, ...).
"""
from __future__ import annotations

import re
import time

TAG = "ragen2.instance"
LATEST = "latest"
ID = re.compile(r"^(\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2})(?:-(\d+))?$")


def order(instance: str) -> tuple[str, int]:
    m = ID.match(instance)
    return (m.group(1), int(m.group(2) or 1)) if m else (instance, 0)


def new_instance(spec, now: float | None = None) -> str:
    """A fresh instance id; its folder is created here, so two drivers never share one."""
    root = spec.sweep_root
    root.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S", time.gmtime(now))
    n = 1
    while True:
        instance = stamp if n == 1 else f"{stamp}-{n}"
        try:
            (root / instance).mkdir()
            return instance
        except FileExistsError:
            n += 1


def known_instances(spec, parents: list) -> dict:
    """Instances found as folders under <storage>/<name> or as parent runs (tag ragen2.instance)."""
    root = spec.sweep_root
    found = {p.name: None for p in root.iterdir() if p.is_dir() and ID.match(p.name)} if root.is_dir() else {}
    for run in sorted(parents, key=lambda r: r.info.start_time or 0):
        if run.data.tags.get(TAG):
            found[run.data.tags[TAG]] = run
    return dict(sorted(found.items(), key=lambda kv: order(kv[0])))


def pick(known: dict, wanted: str) -> str | None:
    if not known:
        return None
    if wanted == LATEST:
        return list(known)[-1]
    return wanted if wanted in known else None
