"""GRPO step throughput: our trainer vs TRL's GRPOTrainer, same tiny policy, same prompts, CPU.

Single-turn FrozenLake (8 prompts x 8 completions, at most 48 new tokens, temperature 1), one
process each, run back to back. Throughput = generated tokens / wall time of the steps (rollout +
update; the first step of each is a warm-up and not counted). The last line is one JSON object
with ``ratio`` = our tokens/s / TRL tokens/s (goal 1.5). TRL is a benchmark-only extra:
``pip install -e .[bench]``.

    python benchmarks/step_vs_trl.py [--steps 4] [--threads 2]
    python benchmarks/step_vs_trl.py --model smollm2-135m-instruct --lora-r 16 --groups 4 --group-size 4

TRL runs without gradient checkpointing, as ours does (GRPOConfig turns it on by default, which
recomputes the forward in the backward); ``--trl-checkpointing`` restores TRL's default.
``--model`` takes any ``policy.model`` (an HF folder, a .gguf, smollm2-135m-instruct): both sides then
prompt in its chat template and stop at its end-of-turn token; ``--lora-r`` trains LoRA adapters on
both sides (ours: ``policy.lora``; TRL: a peft ``LoraConfig`` on the same modules).
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time

import torch

from ragen2_core.config import load_config
from ragen2_core.envs.registry import env_factory
from ragen2_core.policy.load import resolve_policy_path
from ragen2_core.policy.gguf import resolve_model
from ragen2_core.policy.model import load_tokenizer
from ragen2_core.rollout.episodes import single_token_id
from ragen2_core.rollout.prompt import load_prompt_format, user_text
from ragen2_core.tracking import MemorySink
from ragen2_core.train.trainer import run

GROUPS, GROUP_SIZE, MAX_NEW = 8, 8, 48
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def default_policy() -> str:
    """The cached embedded policy of the default config (built on first use)."""
    cfg = load_config("sweeps/base/frozenlake_tiny.yaml")
    return resolve_policy_path(cfg.policy, cfg.warmstart, cfg.env)


def ours(steps: int, threads: int, out: str, *, path: str | None = None, groups: int = GROUPS,
         group_size: int = GROUP_SIZE, max_new: int = MAX_NEW, extra: tuple[str, ...] = ()) -> dict:
    """Our trainer on `path` (default: the embedded policy); `extra` are more config overrides."""
    cfg = load_config("sweeps/base/frozenlake_tiny.yaml", [
        f"policy.model={path or default_policy()}", "env.max_turns=1", f"rollout.n_groups={groups}",
        f"rollout.group_size={group_size}",
        f"rollout.max_new_tokens={max_new}", f"train.steps={steps + 1}", "train.eval_every=0",
        f"train.threads={threads}", f"train.output_dir={out}", "algo.advantage=grpo", "train.grad_accum=1",
        "collapse.every=0", *extra])
    sink = MemorySink()
    run(cfg, sink)
    timed = sink.metrics[1:]  # step 1 warms up
    tokens = sum(m["rollout/response_tokens"] * groups * group_size for _, m in timed)
    seconds = sum(m["time/rollout_s"] + m["time/update_s"] for _, m in timed)
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
            "rollout_tokens_per_s": tokens / sum(m["time/rollout_s"] for _, m in timed),
            "update_s": sum(m["time/update_s"] for _, m in timed) / len(timed)}


def trl(steps: int, threads: int, out: str, *, path: str | None = None, groups: int = GROUPS,
        group_size: int = GROUP_SIZE, max_new: int = MAX_NEW, cuda: bool = False, lora_r: int = 0,
        checkpointing: bool = False) -> dict:
    """TRL's GRPOTrainer on `path` (default: the embedded policy); `cuda` trains in bf16 on the GPU.
    `checkpointing`: TRL's default gradient checkpointing (GRPOConfig turns it on; our trainer does
    not checkpoint, so off is the same work)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    cfg = load_config("sweeps/base/frozenlake_tiny.yaml", ["env.max_turns=1"])
    path = path or default_policy()
    tok = load_tokenizer(path)
    prompt_format = load_prompt_format(tok, "auto")  # the prompt our trainer renders: the model's template, or raw text
    make_env = env_factory(cfg.env)
    prompts, seeds = [], list(range(groups * (steps + 1)))
    for s in seeds:
        env = make_env()
        prompts.append(prompt_format.start(env.system_prompt(), user_text(1, env.reset(s), env.actions_left, max_new)).text)
    stop = [t for t in (single_token_id(tok, "</answer>"), tok.eos_token_id,
                        single_token_id(tok, prompt_format.end_of_turn) if prompt_format.end_of_turn else None) if t is not None]

    def reward(completions, seed, **_):
        out = []
        for text, s in zip(completions, seed):
            env = make_env()
            env.reset(s)
            out.append(env.step("<think>" + text).reward)
        return out

    class Clock(TrainerCallback):
        def __init__(self):
            self.starts, self.ends, self.tokens = [], [], []

        def on_step_begin(self, args, state, control, **kw):
            self.starts.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kw):
            self.ends.append(time.perf_counter())

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs:
                self.tokens.append(logs["completions/mean_length"] * groups * group_size)

    args = GRPOConfig(output_dir=out, per_device_train_batch_size=groups * group_size,
                      num_generations=group_size, max_completion_length=max_new, temperature=1.0,
                      top_k=0, learning_rate=5e-5, max_steps=steps + 1, logging_steps=1, use_cpu=not cuda, bf16=cuda,
                      report_to=[], save_strategy="no", beta=0.0, dataloader_num_workers=0,
                      shuffle_dataset=False, gradient_checkpointing=checkpointing,
                      # stop where our engine stops, so both generate the same kind of replies
                      generation_kwargs={"eos_token_id": stop})
    clock = Clock()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16 if cuda else torch.float32)
    peft = None
    if lora_r:
        from peft import LoraConfig
        peft = LoraConfig(r=lora_r, lora_alpha=2 * lora_r, target_modules=LORA_TARGETS, task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args,
                          train_dataset=Dataset.from_dict({"prompt": prompts, "seed": seeds}),
                          processing_class=tok, callbacks=[clock], peft_config=peft)
    trainer.train()
    seconds = sum(e - s for s, e in zip(clock.starts[1:], clock.ends[1:]))
    tokens = sum(clock.tokens[1:])
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", help="policy.model for both (default: the embedded policy)")
    ap.add_argument("--lora-r", type=int, default=0, help="LoRA rank on both sides (0: full fine-tuning)")
    ap.add_argument("--groups", type=int, default=GROUPS)
    ap.add_argument("--group-size", type=int, default=GROUP_SIZE)
    ap.add_argument("--trl-checkpointing", action="store_true",
                    help="TRL with its default gradient checkpointing (recomputes the forward in the backward)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    path = resolve_model(a.model) if a.model else None
    shape = {"groups": a.groups, "group_size": a.group_size}
    lora = (f"policy.lora.r={a.lora_r}", f"policy.lora.alpha={2 * a.lora_r}",
            f"policy.lora.target_modules={LORA_TARGETS}") if a.lora_r else ()
    with tempfile.TemporaryDirectory() as d:
        mine = ours(a.steps, a.threads, f"{d}/ours", path=path, extra=lora, **shape)
        theirs = trl(a.steps, a.threads, f"{d}/trl", path=path, lora_r=a.lora_r, checkpointing=a.trl_checkpointing,
                     **shape)
    for name, r in (("ours", mine), ("trl", theirs)):
        print(f"{name:>5}: {r['seconds']:6.2f} s  {r['tokens']:8.0f} tokens  {r['tokens_per_s']:8.1f} tok/s")
    print(json.dumps({"name": "step_vs_trl", "ratio": round(mine["tokens_per_s"] / theirs["tokens_per_s"], 2),
                      "goal": 1.5, "steps": a.steps, "model": a.model or "embedded", "lora_r": a.lora_r,
                      "trl_gradient_checkpointing": a.trl_checkpointing,
                      **shape, "ours": mine, "trl": theirs}))


if __name__ == "__main__":
    main()
