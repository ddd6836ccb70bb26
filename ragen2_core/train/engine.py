"""Distributed training wrapper: the project's only DeepSpeed import.

`TrainEngine` wraps one trainable module (actor or critic) in a DeepSpeed engine; `FrozenModel`
holds the reference policy. Gradient-accumulation scaling happens here and nowhere else: DeepSpeed
divides each micro-batch loss by `grad_accum` inside `backward`, so losses stay plain means.

Single process (the trainer, a notebook, a test); no launcher needed, torch.distributed is set up
with world size 1 (gloo on CPU, nccl on GPU):

    from ragen2_core.train.engine import TrainEngine, FrozenModel

    ref = FrozenModel(model)                       # copy BEFORE wrapping: ZeRO-3 partitions `model`
    actor = TrainEngine(model, lr=cfg.algo.actor_lr, zero_stage=cfg.train.zero_stage,
                        grad_accum=cfg.train.grad_accum, micro_batch_size=8,
                        max_grad_norm=cfg.algo.max_grad_norm, user_config=cfg.train.deepspeed_config)
    for micro_batch in micro_batches:              # grad_accum micro-batches per optimizer step
        loss = loss_fn(actor.forward(**micro_batch).logits, ref.logits(**micro_batch))
        actor.backward(loss)                       # loss NOT divided by grad_accum
        if actor.step():                           # True when the optimizer was applied
            log(actor.grad_norm(), actor.lr())     # a read from the device: last_grad_norm() defers it
    actor.save("runs/x/ckpt", "step_10", client_state={"step": 10})
    client_state = actor.load("runs/x/ckpt", "step_10")
    actor.module.save_pretrained("out", state_dict=actor.state_dict_for_export())

    python -c "from ragen2_core.train.engine import init_distributed; print(init_distributed())"  # (0, 1)

Several processes (data parallel; each rank feeds its own shard of the batch):

    OMP_NUM_THREADS=1 torchrun --nproc_per_node 2 my_script.py     # or: deepspeed my_script.py

The launcher sets RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT and they are used as
given. Every rank must call `backward`, `step`, `save`, `load` and `state_dict_for_export`
(collectives).

Optimizer: DeepSpeed's config-driven AdamW. On CPU the config sets `torch_adam: true`, so DeepSpeed
builds `torch.optim.AdamW`: it needs no compiled op, is the reference implementation, and works with
ZeRO stages 0-3 on CPU. (DeepSpeed's CPU FusedAdam also runs, but only after a JIT C++ build and
with slightly different rounding.) On CUDA the flag is left false, so DeepSpeed picks its fused
kernel. A user JSON can override either choice, e.g. `"optimizer": {"params": {"torch_adam": false}}`;
with ZeRO-Offload set it false so DeepSpeed uses its CPU Adam.
"""
from __future__ import annotations

import atexit
import copy
import json
import logging
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Optional

import torch

from ragen2_core.schema import merge

_CLIENT_KEY = "ragen2_client_state"  # caller's state nested under one key, apart from DeepSpeed's own


def _deepspeed():
    """Import DeepSpeed lazily: the import is slow and must see DS_ACCELERATOR first."""
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed

    # DeepSpeed logs its whole config at INFO on every initialize; keep runs readable.
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    return deepspeed


def init_distributed() -> tuple[int, int]:
    """Set up torch.distributed once; returns (rank, world_size).

    Under torchrun / the deepspeed launcher the environment already describes the job. Without a
    launcher this becomes a one-process group on a free local port.
    """
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    cuda = torch.cuda.is_available()
    if "WORLD_SIZE" not in os.environ:
        # No launcher: a one-process group over a private file store. Nothing is written to
        # os.environ and no port is taken, so child processes (a CLI run from a test, Ray
        # workers) never inherit a rendezvous address that this process is still holding.
        os.environ.setdefault("LOCAL_RANK", "0")  # DeepSpeed asserts on it; harmless to inherit
        store = tempfile.NamedTemporaryFile(prefix="ragen2-pg-", delete=False).name
        atexit.register(_remove, store)  # the store outlives the group; nothing reads it after exit
        torch.distributed.init_process_group("nccl" if cuda else "gloo", init_method=f"file://{store}",
                                             rank=0, world_size=1)
        _no_shm_comm()
        _deepspeed().init_distributed(dist_backend="nccl" if cuda else "gloo")
        return 0, 1
    if cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    _deepspeed().init_distributed(dist_backend="nccl" if cuda else "gloo")
    return torch.distributed.get_rank(), torch.distributed.get_world_size()


def shutdown_distributed() -> None:
    """Destroy the process group at the end of a run, so NCCL frees its communicators before exit
    (torch warns about, and can hang on, a group left for interpreter teardown)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _no_shm_comm() -> None:
    """A one-process group never communicates, so DeepSpeed's shared-memory allreduce op is not
    needed; left to itself, its comm backend probes every op's compatibility (compiler test runs,
    ~2 s per process) and JIT-compiles that op on a machine's first run (~30 s). DeepSpeed reads
    the probe's result, ``deepspeed.ops.__compatible_ops__``, only to decide on that op."""
    ops = _deepspeed().ops
    if "__compatible_ops__" in vars(ops):  # probed at import (DeepSpeed < 0.19.8): skip the build
        ops.__compatible_ops__["deepspeed_shm_comm"] = False
    else:  # probed on first access (0.19.8 on): skip the probe as well
        ops.__compatible_ops__ = {"deepspeed_shm_comm": False}


def _world_size() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1"))


def ds_config(*, lr: float, zero_stage: int, grad_accum: int, micro_batch_size: int, max_grad_norm: float,
              user_config: Optional[str] = None, bf16: bool = False) -> dict:
    """The DeepSpeed config dict; a user JSON file (path) is deep-merged over it and wins.

    `train_batch_size` is always micro * accum * world_size of the merged values; a user file that
    sets a conflicting `train_batch_size` is an error rather than silently rewritten.
    """
    config = {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": grad_accum,
        "optimizer": {"type": "AdamW", "params": {
            "lr": lr, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0,
            "torch_adam": not torch.cuda.is_available()}},
        "gradient_clipping": max_grad_norm,
        "zero_optimization": {"stage": zero_stage},
        "bf16": {"enabled": bf16},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    user = {}
    if user_config:
        user = json.loads(Path(user_config).expanduser().read_text())
        if not isinstance(user, dict):
            raise ValueError(f"deepspeed_config {user_config}: top level must be a JSON object")
        config = merge(config, user)
    total = config["train_micro_batch_size_per_gpu"] * config["gradient_accumulation_steps"] * _world_size()
    if "train_batch_size" in user and user["train_batch_size"] != total:
        raise ValueError(
            f"deepspeed_config {user_config}: train_batch_size {user['train_batch_size']} != micro batch "
            f"{config['train_micro_batch_size_per_gpu']} x grad accum {config['gradient_accumulation_steps']} "
            f"x world size {_world_size()} = {total}; drop train_batch_size from the file or make it match")
    config["train_batch_size"] = total
    return config


class TrainEngine:
    """One trainable module under DeepSpeed (any ZeRO stage); call forward/backward/step per micro-batch."""

    def __init__(self, model: torch.nn.Module, *, lr: float, zero_stage: int, grad_accum: int,
                 micro_batch_size: int, max_grad_norm: float, user_config: Optional[str] = None,
                 bf16: bool = False):
        init_distributed()
        self.config = ds_config(lr=lr, zero_stage=zero_stage, grad_accum=grad_accum,
                                micro_batch_size=micro_batch_size, max_grad_norm=max_grad_norm,
                                user_config=user_config, bf16=bf16)
        params = [p for p in model.parameters() if p.requires_grad]
        self.engine, *_ = _deepspeed().initialize(model=model, model_parameters=params, config=self.config)
        self._grad_norm = math.nan

    # ------------------------------------------------------------------ identity
    @property
    def module(self) -> torch.nn.Module:
        """The unwrapped model, e.g. for generation (under ZeRO-3 its forward hooks gather weights)."""
        return self.engine.module

    @property
    def zero_stage(self) -> int:
        return self.engine.zero_optimization_stage()

    @property
    def grad_accum(self) -> int:
        return self.engine.gradient_accumulation_steps()

    @property
    def rank(self) -> int:
        return torch.distributed.get_rank()

    @property
    def world_size(self) -> int:
        return torch.distributed.get_world_size()

    # ------------------------------------------------------------------ training
    def forward(self, *args, **kwargs):
        return self.engine(*args, **kwargs)

    def backward(self, loss: torch.Tensor) -> None:
        """Backpropagate the micro-batch mean loss; DeepSpeed divides it by grad_accum."""
        self.engine.backward(loss)

    def is_boundary(self) -> bool:
        """Whether the current micro-batch is the last of its accumulation window (step() applies the optimizer)."""
        return self.engine.is_gradient_accumulation_boundary()

    def step(self) -> bool:
        """Finish the micro-batch; returns True when the optimizer was applied."""
        boundary = self.is_boundary()
        # Stage 0 in fp32 clips through torch and keeps no norm; at the boundary p.grad is already reduced.
        own_norm = self._param_grad_norm() if boundary and self.zero_stage == 0 else math.nan
        self.engine.step()
        if boundary:
            ds_norm = self.engine.get_global_grad_norm()
            self._grad_norm = own_norm if ds_norm is None else (
                ds_norm.detach().clone() if isinstance(ds_norm, torch.Tensor) else float(ds_norm))
        return boundary

    def _param_grad_norm(self) -> torch.Tensor | float:
        grads = [p.grad for p in self.engine.module.parameters() if p.grad is not None]
        if not grads:
            return math.nan
        return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))

    def grad_norm(self) -> float:
        """Global gradient norm (before clipping) of the last applied step; NaN before the first."""
        return float(self._grad_norm)

    def last_grad_norm(self) -> torch.Tensor | float:
        """`grad_norm` as it is kept: a tensor not yet read from the device (reading it makes the
        host wait for the device, so a loop collects them and reads them once), or a float."""
        return self._grad_norm

    def lr(self) -> float:
        return float(self.engine.get_lr()[0])

    # ------------------------------------------------------------------ checkpoints
    @property
    def frozen(self) -> bool:
        """Whether part of the module is frozen (LoRA's base weights): checkpoints then hold the
        trainable part only, and the frozen part comes from the policy the run loads at start."""
        return any(not p.requires_grad for p in self.engine.module.parameters())

    def save(self, directory: str | os.PathLike, tag: str, client_state: Optional[dict] = None) -> None:
        """Model, optimizer and lr-scheduler state under directory/tag; every rank must call it."""
        self.engine.save_checkpoint(str(directory), tag=tag, client_state={_CLIENT_KEY: client_state or {}},
                                    exclude_frozen_parameters=self.frozen)

    def load(self, directory: str | os.PathLike, tag: Optional[str] = None) -> dict[str, Any]:
        """Restore a `save` (tag None = the newest); returns the client_state given to it."""
        # DeepSpeed answers a missing checkpoint with a bare assert (or a warning and None).
        marker = Path(directory) / (tag if tag is not None else "latest")
        if not marker.exists():
            raise FileNotFoundError(f"no DeepSpeed checkpoint {tag or '(latest)'} under {directory}")
        path, state = self.engine.load_checkpoint(str(directory), tag=tag, load_module_strict=not self.frozen)
        if path is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint {tag or '(latest)'} under {directory}")
        return state.get(_CLIENT_KEY, {})

    def state_dict_for_export(self) -> dict[str, torch.Tensor]:
        """Full fp32 CPU state dict for `module.save_pretrained(dir, state_dict=...)`; collective under ZeRO-3."""
        module = self.engine.module
        with _deepspeed().zero.GatheredParameters(list(module.parameters()), enabled=self.zero_stage == 3):
            state = {k: v.detach().float().cpu().clone() for k, v in module.state_dict().items()}
            if self.engine.bfloat16_enabled() or self.engine.fp16_enabled():
                # Module weights are then low-precision copies; the optimizer holds the fp32 masters.
                masters = self._fp32_masters()
                for name, p in module.named_parameters(remove_duplicate=False):  # tied weights: every name
                    if id(p) in masters:
                        state[name] = masters[id(p)].detach().float().cpu().clone()
        return state

    def _fp32_masters(self) -> dict[int, torch.Tensor]:
        """id(module parameter) -> its full fp32 master copy, where the optimizer keeps one."""
        opt = self.engine.optimizer
        # Stage 0 bf16/fp16 (unfused wrapper) keeps one fp32 tensor per parameter.
        pairs = zip(getattr(opt, "fp16_groups", []), getattr(opt, "fp32_groups", []))
        masters = {id(lo): hi for los, his in pairs for lo, hi in zip(los, his) if hi.shape == lo.shape}
        for p in self.engine.module.parameters():  # ZeRO 1-3 shard the masters: reassemble
            full = _deepspeed().utils.safe_get_full_fp32_param(p)
            if full is not None:
                masters[id(p)] = full
        return masters


def reference_policy(model: torch.nn.Module, other: torch.nn.Module | None = None):
    """The KL term's reference, built before the actor's TrainEngine: ``other`` frozen when given
    (``algo.kl_reference``: a policy other than the start), else for a LoRA policy the same model
    with its adapters switched off (no copy; its base weights never train), else a frozen copy of
    the starting model."""
    from ragen2_core.policy.lora import AdaptersOff, has_adapters
    if other is not None:
        return FrozenModel(other)
    return AdapterOffReference(AdaptersOff(model)) if has_adapters(model) else FrozenModel(model)


class AdapterOffReference:
    """`FrozenModel`'s interface over the base of a LoRA model (`.module`, `.logits`)."""

    def __init__(self, module: torch.nn.Module):
        self.module = module

    def logits(self, **kwargs) -> torch.Tensor:
        with torch.no_grad():
            return self.module(**kwargs).logits


class FrozenModel:
    """The reference policy: a frozen deep copy of the initial actor, kept out of DeepSpeed training.

    It is a plain module replicated on every rank, which is right for CPU and single-GPU runs. For
    ZeRO-3 across several GPUs one would instead wrap it in an inference-only DeepSpeed engine
    (stage-3 config, no optimizer) so its weights are partitioned too. Build it before the actor's
    TrainEngine: ZeRO-3 partitions the actor's weights in place.
    """

    def __init__(self, model: torch.nn.Module, device: Optional[torch.device | str] = None):
        if any(hasattr(p, "ds_id") for p in model.parameters()):
            raise ValueError("model is already partitioned by ZeRO-3; create FrozenModel before TrainEngine")
        if device is None:
            device = f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if torch.cuda.is_available() else "cpu"
        self.module = copy.deepcopy(model).to(device).requires_grad_(False).eval()

    def logits(self, **kwargs) -> torch.Tensor:
        with torch.no_grad():
            return self.module(**kwargs).logits


def agree(reason: str | None, world: int) -> str | None:
    """Rank 0's stop decision on every rank (only rank 0 evaluates), so all ranks leave together."""
    if world == 1:
        return reason
    box = [reason]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


def total_over_ranks(n: int, world: int) -> int:
    """Sum of `n` over the data-parallel ranks (each rolls out and filters its own groups)."""
    if world == 1:
        return n
    # NCCL reduces CUDA tensors only; gloo takes CPU ones.
    nccl = torch.distributed.get_backend() == "nccl"
    box = torch.tensor([n], dtype=torch.long, device=f"cuda:{torch.cuda.current_device()}" if nccl else "cpu")
    torch.distributed.all_reduce(box)
    return int(box.item())
