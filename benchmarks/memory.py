"""Peak resident memory of one RL step at a real vocabulary size: whole-micro-batch logits (before)
vs the chunked output head (after), and with LoRA.

A random-init model of Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 heads / 2 KV heads, MLP 4864,
vocabulary 151,936, tied head) in bf16, with a small byte-level tokenizer of the envs' text (ids it
cannot decode are dropped from the reply text; the memory of the step does not depend on them).
Sokoban, 2 groups x 2 rollouts, replies of at most 32 tokens, one training step, MI diagnostics and
evaluation off. Each variant runs in its own process; its peak is the kernel's high-water mark
(VmHWM) read when the step's metrics are logged, so the final export is not counted; the whole
run's peak (export included) is reported beside it.

    python benchmarks/memory.py                              # full (before), chunked (after), lora
    python benchmarks/memory.py --shape proxy                # same vocabulary, 2 narrow layers: seconds
    python benchmarks/memory.py --variants chunked,lora --lora-r 16
    python benchmarks/memory.py --model smollm2-135m-instruct --variants chunked,lora   # a real model, fp32

Variants: ``full`` = ``train.logit_chunk=0`` (the previous path), ``chunked`` = the default
``train.logit_chunk``, ``lora`` = chunked + ``policy.lora.r``. The last line printed is one JSON
object: per variant ``step_peak_gb``, ``run_peak_gb`` (export included), ``rss_before_load_gb``
(interpreter and imports), ``rss_before_step_gb`` (model and DeepSpeed engine built, before the rollout),
``step_s``, and ``ratio`` = full / chunked step peak. On a shared machine, run it inside a memory limit (e.g. a
cgroup) so that an overrun kills only this process.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHAPES = {
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2),
    "proxy": dict(hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2),
}
VOCAB = 151_936


def gb(kib: int) -> float:
    return round(kib / 2**20, 3)


def status_kib(key: str) -> int:
    """VmRSS / VmHWM of this process, in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def build(shape: str, out: Path, vocab: int = VOCAB) -> None:
    """Random-init bf16 model of `shape` and a tokenizer of the envs' text, saved to `out`."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from ragen2_core.config import load_config
    from ragen2_core.policy.model import save_policy
    from ragen2_core.policy.tokenizer import train_tokenizer
    from ragen2_core.policy.warmstart import expert_traces

    cfg = load_config(None, ["env.name=sokoban", "warmstart.envs=[sokoban]"])
    texts = [a + b for ep in expert_traces(cfg.warmstart, cfg.env, 32, 0) for a, b in ep]
    tok = train_tokenizer(texts, vocab_size=1024)
    config = Qwen2Config(vocab_size=vocab, max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6,
                         tie_word_embeddings=True, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                         bos_token_id=None, **SHAPES[shape])
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    save_policy(model, tok, out, {"benchmark": f"random-init {shape}"})


def child(model_dir: str, variant: str, lora_r: int, threads: int, dtype: str = "bfloat16") -> dict:
    """One RL step of `variant`; returns its memory and time."""
    from ragen2_core.config import load_config
    from ragen2_core.tracking import MemorySink
    from ragen2_core.train.trainer import run

    class PeakAtStep(MemorySink):
        """Reads resident memory when the run has built its model and engine (its parameters are
        logged then) and the high-water mark when the step's metrics arrive (before the export)."""
        step_peak_kib = start_kib = 0

        def log_params(self, params):
            PeakAtStep.start_kib = status_kib("VmRSS")
            super().log_params(params)

        def log_metrics(self, metrics, step):
            PeakAtStep.step_peak_kib = status_kib("VmHWM")
            super().log_metrics(metrics, step)

    over = [f"policy.model={model_dir}", f"policy.dtype={dtype}", "env.name=sokoban", "rollout.n_groups=2",
            "rollout.group_size=2", "rollout.max_new_tokens=32", "train.steps=1", "train.eval_every=0",
            "collapse.every=0", f"train.threads={threads}", f"train.output_dir={tempfile.mkdtemp(prefix='ragen2-mem-')}"]
    over += {"full": ["train.logit_chunk=0"], "chunked": [], "lora": [f"policy.lora.r={lora_r}"]}[variant]
    cfg = load_config(None, over)
    before_load_kib = status_kib("VmRSS")   # interpreter, torch and transformers imported
    sink = PeakAtStep()
    t0 = time.perf_counter()
    run(cfg, sink)
    return {"step_peak_gb": gb(PeakAtStep.step_peak_kib), "run_peak_gb": gb(status_kib("VmHWM")),
            "rss_before_step_gb": gb(PeakAtStep.start_kib), "rss_before_load_gb": gb(before_load_kib),
            "reply_tokens": sink.metrics[0][1]["cost/rollout_tokens"],
            "step_s": round(sink.metrics[0][1]["time/step_s"], 1), "total_s": round(time.perf_counter() - t0, 1),
            "logit_chunk": cfg.train.logit_chunk, "lora_r": cfg.policy.lora.r}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    ap.add_argument("--variants", default="full,chunked,lora")
    ap.add_argument("--lora-r", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", help="a policy.model (HF folder, .gguf, smollm2-135m-instruct) instead of --shape; float32")
    ap.add_argument("--dtype", help=argparse.SUPPRESS)
    ap.add_argument("--child", help=argparse.SUPPRESS)      # internal: run one variant in this process
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    ap.add_argument("--build", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.build:
        build(args.shape, Path(args.model_dir))
        return
    if args.child:
        print("RESULT " + json.dumps(child(args.model_dir, args.child, args.lora_r, args.threads, args.dtype)), flush=True)
        return
    variants = args.variants.split(",")
    bad = [v for v in variants if v not in ("full", "chunked", "lora")]
    if bad:
        sys.exit(f"--variants: unknown {bad}; choose from full, chunked, lora")
    with tempfile.TemporaryDirectory(prefix="ragen2-mem-model-") as d:
        if args.model:
            from ragen2_core.policy.gguf import resolve_model
            d, dtype = resolve_model(args.model), "float32"  # bf16 matmuls crawl on a CPU without bf16
        else:
            # Built in a process of its own, so this one stays small while the variants run.
            subprocess.run([sys.executable, __file__, "--build", "--shape", args.shape, "--model-dir", d], check=True)
            dtype = "bfloat16"
        runs = {}
        for v in variants:
            proc = subprocess.run([sys.executable, __file__, "--child", v, "--model-dir", d, "--lora-r", str(args.lora_r),
                                   "--threads", str(args.threads), "--dtype", dtype], capture_output=True, text=True,
                                  env=os.environ | {"OMP_NUM_THREADS": str(args.threads)})
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if line is None:
                runs[v] = {"error": f"exit {proc.returncode}", "stderr_tail": proc.stderr[-600:]}
            else:
                runs[v] = json.loads(line[len("RESULT "):])
            print(f"[memory] {v}: {runs[v]}", flush=True)
    out = {"benchmark": "memory", "shape": args.model or args.shape, "vocab": VOCAB if not args.model else None, "batch": "2 groups x 2 rollouts, 32-token replies",
           **{v: r for v, r in runs.items()}}
    if "step_peak_gb" in runs.get("full", {}) and "step_peak_gb" in runs.get("chunked", {}):
        out["ratio"] = round(runs["full"]["step_peak_gb"] / runs["chunked"]["step_peak_gb"], 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
