"""Count host-device synchronisation points and aten ops in a block of code, on any device.

On a GPU, every read of a device value by the host (``.item()``, ``bool(t)``, ``int(t)``,
``.tolist()``, ``.cpu()``, ``nonzero``, boolean-mask indexing, ``masked_select``) waits until the
device has finished everything queued before it, so the host cannot launch the next kernels while
the device works. On a CPU such a read costs nothing, which is why a CPU run never shows it; this
module counts the reads where they happen, so that a budget measured on CPU holds on a GPU.

    from ragen2_core.rollout.syncs import count_syncs
    with count_syncs() as c:
        session.decode(logits, sampling, stop_ids, generator)
    c.syncs       # host reads of device values, each counted once (an .item() inside nonzero is one)
    c.ops         # aten ops the Python code called (not the ones they call), views and allocations left out
    c.by_name     # {"aten::_local_scalar_dense": 3, "Tensor.tolist": 1, ...}

Two sources are combined: torch.profiler sees the aten ops (``aten::_local_scalar_dense`` behind
``item``/``bool``/``int``/``float``, ``nonzero``, ``masked_select``; boolean-mask indexing runs
``nonzero``), and a TorchFunctionMode sees ``tolist``/``numpy``/``cpu``, which dispatch no aten op
when the tensor is already on the CPU.
"""
from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch.overrides import TorchFunctionMode

# aten ops that make the host wait for the device; a nested one (the item() inside masked_select)
# belongs to its outermost sync and is not counted again.
SYNC_OPS = frozenset({"aten::_local_scalar_dense", "aten::item", "aten::is_nonzero", "aten::nonzero",
                      "aten::masked_select", "aten::nonzero_static"})
# Checks that run on the device without the host waiting (on a CPU they read the value, so the read
# inside them is not counted): torch.multinomial validates its input this way.
ASYNC_CHECKS = frozenset({"aten::_assert_async"})
# Tensor methods that copy a device tensor to the host; on a CPU tensor they dispatch no aten op.
HOST_READS = frozenset({"tolist", "numpy", "cpu"})
# aten ops that launch no kernel on a device: views, metadata and allocation.
NO_KERNEL = frozenset({
    "aten::view", "aten::as_strided", "aten::as_strided_", "aten::reshape", "aten::_reshape_alias",
    "aten::unsqueeze", "aten::squeeze", "aten::expand", "aten::expand_as", "aten::slice", "aten::select",
    "aten::transpose", "aten::t", "aten::permute", "aten::detach", "aten::alias", "aten::empty",
    "aten::empty_strided", "aten::empty_like", "aten::_unsafe_view", "aten::lift_fresh", "aten::resolve_conj",
    "aten::resolve_neg", "aten::split", "aten::split_with_sizes", "aten::chunk", "aten::unbind",
    "aten::narrow", "aten::view_as", "aten::to", "aten::contiguous", "aten::result_type",
    "aten::is_nonzero", "aten::item", "aten::_local_scalar_dense", "aten::set_", "aten::unflatten",
    "aten::flatten", "aten::movedim", "aten::numpy_T", "aten::_has_compatible_shallow_copy_type",
})


@dataclass
class SyncCount:
    syncs: int = 0
    ops: int = 0
    by_name: Counter = field(default_factory=Counter)


class _HostReads(TorchFunctionMode):
    def __init__(self, seen: Counter):
        super().__init__()
        self.seen = seen

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in HOST_READS and args and isinstance(args[0], torch.Tensor):
            self.seen[f"Tensor.{name}"] += 1
        return func(*args, **(kwargs or {}))


def _under(event, names) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name in names:
            return True
        parent = parent.cpu_parent
    return False


def _top_level(event) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("aten::"):
            return False
        parent = parent.cpu_parent
    return True


def tally(events, host_reads: Counter) -> SyncCount:
    """SyncCount from profiler events and the host reads the mode saw."""
    out = SyncCount(by_name=Counter(host_reads))
    for e in events:
        if not e.name.startswith("aten::"):
            continue
        if e.name in SYNC_OPS and not _under(e, SYNC_OPS | ASYNC_CHECKS):
            out.by_name[e.name] += 1
        elif _top_level(e) and e.name not in NO_KERNEL:
            out.ops += 1
    out.syncs = sum(out.by_name.values())
    return out


@contextlib.contextmanager
def count_syncs():
    """Count syncs and ops in the ``with`` block; the SyncCount is filled when the block exits."""
    result, reads = SyncCount(), Counter()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof, _HostReads(reads):
        yield result
    counted = tally(prof.events(), reads)
    result.syncs, result.ops, result.by_name = counted.syncs, counted.ops, counted.by_name
