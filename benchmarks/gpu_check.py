"""One command for a lent CUDA machine with no network: our GRPO step under DeepSpeed ZeRO-2 and
ZeRO-0, TRL's GRPOTrainer step and the compiled decode step, on random-init Qwen2.5-0.5B/1.5B shapes.

Per shape: the model is built locally (random init, bf16, vocabulary 151,936; no download), then
  ours        our trainer, bf16, ZeRO-2, HF rollout engine: rollout tokens/s and update seconds per step
  ours_zero0  the same under ZeRO-0 (one GPU needs no partitioning; ZeRO-2 adds its bucketing)
  trl         TRL's GRPOTrainer (``pip install -e .[bench]``) on the same model, prompts and batch
  compiled    the rollout alone (the same 64 prompts), default engine vs ``rollout.compile`` (static
              cache, torch.compile'd decode step with CUDA graphs): tokens/s of each after one
              warm-up rollout, and the warm-up's seconds (``compile_s``); first shape only
  vllm        ours with ``rollout.backend=vllm`` when vLLM imports; otherwise ``{"skipped": why}``
single-turn FrozenLake prompts, 8 groups x 8 rollouts, at most 64 new tokens, 2 steps of which the
first warms up (benchmarks/step_vs_trl.py measures both the same way). On CUDA our optimizer is
DeepSpeed's FusedAdam (scripts/gpu_check_device.sh builds it first). A part that would start with
less than ``PART_S`` seconds left before ``--deadline`` is skipped, so the JSON line always comes.
The last line printed is one JSON object; ``ratio`` per shape is our whole-step tokens/s over TRL's.
When gpu_check.sh's time limit stops the process, the JSON line still comes, with what was measured
and ``"stopped"``. ``--dry`` runs the same code on a tiny shape and a small vocabulary with a small batch (and the
compiled part with torch.compile's "eager" backend): on CPU it checks that every part runs, and its
numbers mean nothing.

    bash scripts/gpu_check.sh                 # on the GPU machine (prepared for about 6 minutes on an H200)
    bash scripts/gpu_check.sh --dry           # anywhere: the plumbing on CPU, a few minutes
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import memory        # noqa: E402  (benchmarks/memory.py: the model shapes and their builder)
import step_vs_trl   # noqa: E402

SHAPES = {"full": ["qwen2.5-0.5b", "qwen2.5-1.5b"], "dry": ["proxy"]}
PART_S = 45      # seconds a part needs at least; one that would start later is skipped
COMPILE_S = 150  # the compiled part: two compiles of the decode step (inductor, CUDA graphs) and four rollouts


def vllm_skip_reason() -> str | None:
    from ragen2_core.config import RolloutConfig
    if "backend" not in RolloutConfig.__dataclass_fields__:
        return "this ragen2 has no rollout.backend field (no vLLM backend)"
    try:
        import vllm  # noqa: F401
    except Exception as e:  # noqa: BLE001  any import failure means: no usable vLLM here
        return f"vllm does not import here: {type(e).__name__}: {e}"
    return None


def part(fn, deadline: float, need: float = PART_S) -> dict:
    """Run one measurement; a failure is reported in the JSON instead of ending the check, and one
    that would start with less than `need` seconds left before the deadline is skipped."""
    if time.monotonic() > deadline - need:
        return {"skipped": f"not started: less than {need:.0f} s left before --deadline"}
    t0 = time.perf_counter()
    try:
        out = fn()
    except Exception as e:  # noqa: BLE001
        out = {"error": f"{type(e).__name__}: {e}"[:400]}
    return out | {"wall_s": round(time.perf_counter() - t0, 1)}


def compiled_rollout(model_dir: Path, *, groups: int, group_size: int, max_new: int, dry: bool) -> dict:
    """Rollout tokens/s of the default engine and of rollout.compile on the same prompts."""
    from dataclasses import replace

    from ragen2_core.config import load_config
    from ragen2_core.envs.registry import env_factory
    from ragen2_core.policy.model import load_pretrained
    from ragen2_core.rollout.compiled import StaticKVSession
    from ragen2_core.rollout.episodes import rollout
    from ragen2_core.rollout.sampler import SamplingParams

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, tok = load_pretrained(str(model_dir), dtype="bfloat16" if device == "cuda" else "float32")
    model = model.to(device).eval()
    make_env = env_factory(load_config(None, ["env.name=frozenlake", "env.max_turns=1"]).env)
    seeds = [s for s in range(groups) for _ in range(group_size)]
    p = SamplingParams(temperature=1.0, max_new_tokens=max_new)

    def play(compiled: bool) -> tuple[float, int]:
        session = StaticKVSession(model, tok.pad_token_id, backend="eager" if dry else None) if compiled else None
        t0 = time.perf_counter()
        batch = rollout(model, tok, make_env, env_seeds=seeds, dynamics_seeds=seeds, group_ids=seeds,
                        sampling=replace(p, compile=compiled), generator=torch.Generator().manual_seed(0),
                        session=session)
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0, sum(map(sum, batch.response_mask))

    out = {}
    for name, compiled in (("default", False), ("compiled", True)):
        warm_s, _ = play(compiled)  # the compiled one compiles here
        sec, tokens = play(compiled)
        out[name] = {"tokens": tokens, "seconds": sec, "tokens_per_s": tokens / sec, "warmup_s": round(warm_s, 1)}
    return out | {"ratio": out["compiled"]["tokens_per_s"] / out["default"]["tokens_per_s"],
                  "compile_s": out["compiled"]["warmup_s"]}


def check_shape(res: dict, shape: str, *, dry: bool, cuda: bool, steps: int, threads: int, deadline: float,
                compiled: bool, sets: tuple[str, ...] = ()) -> dict:
    """Measure every part on `shape`, filling `res` as they finish (a stopped check reports them)."""
    batch = dict(groups=2, group_size=2, max_new=8) if dry else dict(groups=8, group_size=8, max_new=64)
    res["batch"] = batch
    common = ("policy.dtype=bfloat16",) if cuda else ()
    common = (*common, *sets)
    with tempfile.TemporaryDirectory(prefix=f"ragen2-gpu-{shape}-") as d:
        model_dir = Path(d) / "model"
        t0 = time.perf_counter()
        memory.build(shape, model_dir, vocab=4096 if dry else memory.VOCAB)
        res["build_s"] = round(time.perf_counter() - t0, 1)
        ours = lambda name, zero: part(lambda: step_vs_trl.ours(  # noqa: E731
            steps, threads, f"{d}/{name}", path=str(model_dir), extra=(*common, f"train.zero_stage={zero}"), **batch),
            deadline)
        res["ours"] = ours("ours", 2)
        res["ours_zero0"] = ours("ours_zero0", 0)
        res["trl"] = part(lambda: step_vs_trl.trl(steps, threads, f"{d}/trl", path=str(model_dir), cuda=cuda, **batch),
                          deadline)
        if "tokens_per_s" in res["ours"] and "tokens_per_s" in res["trl"]:
            res["ratio"] = res["ours"]["tokens_per_s"] / res["trl"]["tokens_per_s"]
        res["compiled"] = (part(lambda: compiled_rollout(model_dir, dry=dry, **batch), deadline, need=COMPILE_S)
                           if compiled else {"skipped": "measured on the first shape only"})
        why = vllm_skip_reason()
        res["vllm"] = {"skipped": why} if why else part(lambda: step_vs_trl.ours(
            steps, threads, f"{d}/vllm", path=str(model_dir), extra=(*common, "train.zero_stage=2",
                                                                    "rollout.backend=vllm"), **batch), deadline)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry", action="store_true", help="tiny shape and batch: check the plumbing (CPU is fine)")
    ap.add_argument("--steps", type=int, default=1, help="timed steps after one warm-up step")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="one more config override for our trainer (repeatable), e.g. train.deepspeed_config=ds.json")
    ap.add_argument("--deadline", type=float, default=360,
                    help="seconds from start after which no part starts (gpu_check.sh stops the process at 380)")
    a = ap.parse_args()
    deadline = time.monotonic() + a.deadline
    cuda = torch.cuda.is_available()
    if not cuda and not a.dry:
        sys.exit("gpu_check: no CUDA device here; run with --dry to check the plumbing on CPU")
    torch.set_num_threads(a.threads)
    out = {"name": "gpu_check", "dry": a.dry, "device": torch.cuda.get_device_name(0) if cuda else platform.processor() or "cpu",
           "torch": torch.__version__, "shapes": {}} | ({"overrides": a.set} if a.set else {})
    signal.signal(signal.SIGTERM, lambda *_: finish(out | {"stopped": "SIGTERM (gpu_check.sh's time limit)"}, 124))
    for i, shape in enumerate(SHAPES["dry" if a.dry else "full"]):
        check_shape(out["shapes"].setdefault(shape, {}), shape, dry=a.dry, cuda=cuda, steps=a.steps,
                    threads=a.threads, deadline=deadline, compiled=i == 0, sets=tuple(a.set))
        print(f"[gpu_check] {shape}: {json.dumps(out['shapes'][shape])}", flush=True)
    finish(out, 0, hard=cuda)


def finish(out: dict, code: int, hard: bool = True) -> None:
    """Print the JSON line (what was measured so far, when stopped early) and exit."""
    print(json.dumps(out), flush=True)
    if hard:
        # On an H200 the interpreter hung at exit after this line (just after NCCL warned that our
        # trainer's process group was never destroyed) until gpu_check.sh's timeout; nothing is left to do.
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    main()
