"""Checks a training run can make before its first side effect (output directory, MLflow store and
run, process group, DeepSpeed): each problem is a message naming the field or file and the fix.

    problems = preflight(cfg)          # [] when the run may start; `ragen2 train` exits 2 otherwise

Covered: the env can be built as configured (data files exist and parse, the code sandbox is
available), ``algo.kl_reference`` names a policy that exists, ``train.output_dir`` is not a file, and no stale lock blocks DeepSpeed's op builds
under the torch extensions cache (a build killed half-way leaves one, and every later start would
wait on it forever).
"""
from __future__ import annotations

import os
import time
from pathlib import Path

STALE_LOCK_S = 600.0     # a build of DeepSpeed's ops takes a minute or two; a lock this old is orphaned
LOCK_WAIT_S = 20.0       # a younger lock may be a concurrent build: wait this long for it to go


def preflight(cfg) -> list[str]:
    problems = []
    out = Path(cfg.train.output_dir)
    if out.exists() and not out.is_dir():
        problems.append(f"train.output_dir: {str(out)!r} is a file; give a directory path")
    problems += _env_problems(cfg)
    problems += _reference_problems(cfg)
    problems += build_lock_problems()
    return problems


def _env_problems(cfg) -> list[str]:
    from ragen2_core.envs.registry import env_factory

    try:
        env_factory(cfg.env)()
    except (ValueError, OSError, RuntimeError) as e:  # bad data file, missing file, no sandbox
        return [f"env.{cfg.env.name}: {e}"]
    return []


def _reference_problems(cfg) -> list[str]:
    if cfg.algo.kl_reference == "init":
        return []
    from ragen2_core.policy.load import reference_path
    try:
        reference_path(cfg.algo.kl_reference, cfg.policy)
    except ValueError as e:
        return [str(e)]
    return []


def extensions_root() -> Path:
    """Where torch builds C++ extensions (DeepSpeed's ops): $TORCH_EXTENSIONS_DIR or torch's default."""
    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        return Path(os.environ["TORCH_EXTENSIONS_DIR"])
    from torch.utils.cpp_extension import get_default_build_root

    return Path(get_default_build_root())


def build_lock_problems(root: Path | None = None, wait_s: float = LOCK_WAIT_S) -> list[str]:
    """torch's FileBaton locks (``<root>/<python tag>/<op>/lock``) that stay: older than
    STALE_LOCK_S at once, younger ones after waiting up to ``wait_s`` for them to go."""
    root = extensions_root() if root is None else Path(root)
    deadline = time.monotonic() + wait_s
    while True:
        locks = [p for p in (*root.glob("*/lock"), *root.glob("*/*/lock")) if p.exists()]
        now = time.time()
        stale = [p for p in locks if now - _mtime(p) > STALE_LOCK_S]
        if stale or not locks or time.monotonic() >= deadline:
            return [f"{p}: a lock left by a C++ extension build that did not finish ({now - _mtime(p):.0f} s "
                    "old), so starting DeepSpeed would wait on it forever; if no other training run is "
                    f"building ops now, delete it (rm {p}) and start again" for p in (stale or locks)]
        time.sleep(0.5)


def _mtime(p: Path) -> float:
    try:
        return p.stat().st_mtime
    except FileNotFoundError:
        return time.time()
