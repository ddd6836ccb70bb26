"""Checkpoints: atomic (temp dir + rename), the last k kept, resumable, plus the final HF export.

Layout under ``train.output_dir``::

    checkpoints/step_000010/{actor,critic}/...   DeepSpeed state (model, optimizer, scheduler)
    checkpoints/step_000010/state.json           the step counter and loop state
    policy/                                      save_pretrained export at the end
    policy/adapter/                              a LoRA run's adapters alone (peft format)

A directory only ever appears under its final name once complete, so ``latest`` never sees a
half-written checkpoint, whatever killed the run.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from ragen2_core.atomic import write_text_atomic
from ragen2_core.policy.lora import has_adapters, merged_state_dict, save_adapter
from ragen2_core.policy.model import save_policy

PREFIX = "step_"


def _root(out_dir: Path) -> Path:
    root = Path(out_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    return root


def _barrier() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()


def save(out_dir: Path, step: int, actor, critic, *, keep: int, rank: int = 0, extra: dict | None = None) -> Path:
    """Every rank writes its DeepSpeed shard into one temp dir; rank 0 renames it into place.

    `extra` is JSON-able loop state (running averages, stop counters) stored beside the step."""
    root = _root(out_dir)
    final = root / f"{PREFIX}{step:06d}"
    tmp = root / f".tmp-{PREFIX}{step:06d}"  # a fixed name, so all ranks write to the same place
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
    _barrier()
    actor.save(tmp / "actor", tag="state")
    if critic is not None:
        critic.save(tmp / "critic", tag="state")
    _barrier()
    if rank == 0:
        (tmp / "state.json").write_text(json.dumps({"step": step, **(extra or {})}))
        if final.exists():  # a resumed run re-saving the same step
            shutil.rmtree(final)
        os.replace(tmp, final)
        for old in sorted(root.glob(f"{PREFIX}*"))[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    _barrier()
    return final


def write_json_atomic(path: Path, obj) -> None:
    """A result file appears whole or not at all."""
    write_text_atomic(path, json.dumps(obj, indent=2, default=float))


def latest(out_dir: Path) -> Path | None:
    found = sorted((Path(out_dir) / "checkpoints").glob(f"{PREFIX}*"))
    return found[-1] if found else None


def steps_done(out_dir: Path) -> int:
    """Steps the newest checkpoint holds (step_000039 holds 40), 0 without one."""
    path = latest(out_dir)
    return int(path.name[len(PREFIX):]) + 1 if path else 0


def load(path: Path, actor, critic) -> dict:
    actor.load(path / "actor", tag="state")
    if critic is not None:
        critic.load(path / "critic", tag="state")
    return json.loads((path / "state.json").read_text())


def export_policy(actor, tokenizer, export_dir: Path, *, rank: int = 0) -> None:
    """``save_pretrained`` of the trained policy (full fp32 weights), swapped in atomically.

    Every rank must call this (ZeRO-3 gathers the weights collectively); rank 0 writes."""
    state = actor.state_dict_for_export()
    if rank != 0:
        return
    export_dir = Path(export_dir)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-policy-", dir=export_dir.parent))
    try:
        module = actor.module
        if has_adapters(module):   # a LoRA run: the merged plain model, and the adapters beside it
            save_adapter(module, state, tmp / "adapter")
            state = merged_state_dict(module, state)
        save_policy(module, tokenizer, tmp, {"exported_by": "ragen2 train"}, state_dict=state)
        if export_dir.exists():
            shutil.rmtree(export_dir)
        os.replace(tmp, export_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
