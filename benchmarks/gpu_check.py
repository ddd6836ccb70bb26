"""One command for a lent CUDA machine with no network: rollout tokens/s, RL step time under
DeepSpeed ZeRO-2, and TRL's GRPOTrainer step, on random-init Qwen2.5-0.5B- and 1.5B-shaped models.

Per shape: the model is built locally (random init, bf16, vocabulary 151,936; no download), then
  ours   our trainer, bf16, ZeRO-2, HF rollout engine: rollout tokens/s and update seconds per step
  vllm   the same with ``rollout.backend=vllm`` when vLLM imports and the config has that field;
         otherwise ``{"skipped": why}``
  trl    TRL's GRPOTrainer (``pip install -e .[bench]``) on the same model, prompts and batch
single-turn FrozenLake prompts, 8 groups x 8 rollouts, at most 64 new tokens, 2 steps of which the
first warms up (benchmarks/step_vs_trl.py measures both the same way). The last line printed is one
JSON object. ``--dry`` runs the same code on a tiny shape and a small vocabulary with a small batch:
on CPU it checks that every part runs, and its numbers mean nothing.

    bash scripts/gpu_check.sh                 # on the GPU machine (about 2.5 minutes on an H200)
    bash scripts/gpu_check.sh --dry           # anywhere: the plumbing on CPU, a minute or two
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import memory        # noqa: E402  (benchmarks/memory.py: the model shapes and their builder)
import step_vs_trl   # noqa: E402

SHAPES = {"full": ["qwen2.5-0.5b", "qwen2.5-1.5b"], "dry": ["proxy"]}


def vllm_skip_reason() -> str | None:
    from ragen2_core.config import RolloutConfig
    if "backend" not in RolloutConfig.__dataclass_fields__:
        return "this ragen2 has no rollout.backend field (no vLLM backend)"
    try:
        import vllm  # noqa: F401
    except Exception as e:  # noqa: BLE001  any import failure means: no usable vLLM here
        return f"vllm does not import here: {type(e).__name__}: {e}"
    return None


def part(fn) -> dict:
    """Run one measurement; a failure is reported in the JSON instead of ending the check."""
    t0 = time.perf_counter()
    try:
        out = fn()
    except Exception as e:  # noqa: BLE001
        out = {"error": f"{type(e).__name__}: {e}"[:400]}
    return out | {"wall_s": round(time.perf_counter() - t0, 1)}


def check_shape(shape: str, *, dry: bool, cuda: bool, steps: int, threads: int, sets: tuple[str, ...] = ()) -> dict:
    batch = dict(groups=2, group_size=2, max_new=8) if dry else dict(groups=8, group_size=8, max_new=64)
    common = ("policy.dtype=bfloat16", "train.zero_stage=2") if cuda else ("train.zero_stage=2",)
    common = (*common, *sets)
    with tempfile.TemporaryDirectory(prefix=f"ragen2-gpu-{shape}-") as d:
        model_dir = Path(d) / "model"
        t0 = time.perf_counter()
        memory.build(shape, model_dir, vocab=4096 if dry else memory.VOCAB)
        res = {"build_s": round(time.perf_counter() - t0, 1)}
        res["ours"] = part(lambda: step_vs_trl.ours(steps, threads, f"{d}/ours", path=str(model_dir), extra=common, **batch))
        why = vllm_skip_reason()
        res["vllm"] = {"skipped": why} if why else part(lambda: step_vs_trl.ours(
            steps, threads, f"{d}/vllm", path=str(model_dir), extra=(*common, "rollout.backend=vllm"), **batch))
        res["trl"] = part(lambda: step_vs_trl.trl(steps, threads, f"{d}/trl", path=str(model_dir), cuda=cuda, **batch))
    return res | {"batch": batch}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry", action="store_true", help="tiny shape and batch: check the plumbing (CPU is fine)")
    ap.add_argument("--steps", type=int, default=1, help="timed steps after one warm-up step")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="one more config override for our trainer (repeatable), e.g. train.deepspeed_config=ds.json")
    a = ap.parse_args()
    cuda = torch.cuda.is_available()
    if not cuda and not a.dry:
        sys.exit("gpu_check: no CUDA device here; run with --dry to check the plumbing on CPU")
    torch.set_num_threads(a.threads)
    out = {"name": "gpu_check", "dry": a.dry, "device": torch.cuda.get_device_name(0) if cuda else platform.processor() or "cpu",
           "torch": torch.__version__, "shapes": {}} | ({"overrides": a.set} if a.set else {})
    for shape in SHAPES["dry" if a.dry else "full"]:
        out["shapes"][shape] = check_shape(shape, dry=a.dry, cuda=cuda, steps=a.steps, threads=a.threads,
                                         sets=tuple(a.set))
        print(f"[gpu_check] {shape}: {json.dumps(out['shapes'][shape])}", flush=True)
    print(json.dumps(out), flush=True)
    if cuda:
        # On an H200 the interpreter hung at exit after this line (just after NCCL warned that our
        # trainer's process group was never destroyed) until gpu_check.sh's timeout; nothing is left to do.
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
