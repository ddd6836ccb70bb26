"""Rollout speed: our batched KV-cached engine vs two ways of driving HF ``generate``.

Same 64 FrozenLake episodes (same env seeds), sampling at temperature 1 with a fixed seed, same
per-turn token budget, one process, the three ways run back to back:
  ours        ragen2_core.rollout.episodes.rollout (one cache across turns, lock-step decoding)
  naive       HF generate once per episode and turn, on the full history
  hf_batched  HF generate on the whole batch per turn, re-encoding every history (left padding)
The last line printed is one JSON object; ``ratio`` = naive time / our time (goal >= 8) and
``ratio_vs_hf_batched`` = batched-HF time / our time (goal >= 1.3). ``--compile`` adds
  compiled    our engine with ``rollout.compile`` (static cache, torch.compile'd decode step), timed
              after one warm-up rollout that compiles it (``compile_s``); ``compile_ratio`` = our
              time / compiled time

``--against REV`` adds
  at_REV      the rollout engine of git revision REV (its rollout/sampler.py and episodes.py, or engine.py before the split, loaded beside
              this one), timed alternately with ours; ``ratio_vs_REV`` = its time / our time (a check
              that a change did not slow the engine down, fair on a busy machine)

    python benchmarks/rollout.py [--episodes 64] [--threads 2] [--repeats 2] [--compile] [--against REV]
                                 [--config FILE] [--set k=v ...]

A real model, in its own chat template (the HF drivers render the episodes as the engine does):

    python benchmarks/rollout.py --config sweeps/base/smollm2_frozenlake.yaml \
        --set warmstart.pretrained=false --episodes 16 --skip-naive

``--vllm`` adds the vLLM backend on the same model, episodes and episode loop (run it in the vLLM
environment, ``bash scripts/setup_vllm.sh --real-model``; it warms up on 4 episodes first, and its start-up is
reported apart), with ``vllm_ratio`` = vLLM tokens/s / ours (goal >= 2):

    OMP_NUM_THREADS=2 .venv-vllm/bin/python benchmarks/rollout.py --config sweeps/base/smollm2_frozenlake.yaml \
        --set warmstart.pretrained=false --episodes 16 --skip-naive --vllm

``--profile`` then runs ours and ``hf_batched`` once more each under cProfile and prints the calls
that take the most time of their own.

``--backend vllm`` (run it in the vLLM environment, ``bash scripts/setup_vllm.sh``) measures instead our
engine against the vLLM backend on a random-init model of Qwen2.5-0.5B's shape (vocabulary 151,936,
fp32), the same 64 multi-turn FrozenLake episodes, seeds and per-turn budget through the same
``rollout`` loop; both warm up on a few episodes first, and the engine's start-up is reported apart.
``ratio`` = vLLM tokens/s / ours (goal >= 1.5):

    OMP_NUM_THREADS=2 .venv-vllm/bin/python benchmarks/rollout.py --backend vllm [--size 0.5B]
        [--max-new-tokens 32] [--turns 3] [--episodes 64]
"""
from __future__ import annotations

import argparse
import inspect
import json
import sys
import time
from dataclasses import replace

import torch

from ragen2_core.config import load_config
from ragen2_core.envs.registry import env_factory
from ragen2_core.policy.load import load_policy
from ragen2_core.rollout.episodes import rollout, single_token_id
from ragen2_core.rollout.sampler import SamplingParams
from ragen2_core.rollout.prompt import RAW, RawFormat, load_prompt_format, user_text


def hf_driver(model, tok, make_env, seeds, p: SamplingParams, *, batched: bool, prompt_format: RawFormat = RAW) -> int:
    """Play the episodes with HF generate, rendering them in ``prompt_format`` as the engine does; returns the
    number of generated tokens."""
    envs = [make_env() for _ in seeds]
    obs = [e.reset(s, dynamics_seed=s) for e, s in zip(envs, seeds)]
    enc = lambda t: tok.encode(t, add_special_tokens=False)  # noqa: E731
    convs = [prompt_format.start(e.system_prompt(), user_text(1, o, e.actions_left, p.max_new_tokens)) for e, o in zip(envs, obs)]
    hist = [enc(c.text) for c in convs]
    eot = single_token_id(tok, prompt_format.end_of_turn) if prompt_format.end_of_turn else None
    stop = [t for t in (single_token_id(tok, "</answer>"), tok.eos_token_id, eot) if t is not None]
    kw = dict(do_sample=True, temperature=p.temperature, top_k=0, top_p=1.0,
              max_new_tokens=p.max_new_tokens, eos_token_id=stop, pad_token_id=tok.pad_token_id)
    active, generated, turn = list(range(len(seeds))), 0, 1
    while active:
        if batched:
            L = max(len(hist[b]) for b in active)
            ids = torch.tensor([[tok.pad_token_id] * (L - len(hist[b])) + hist[b] for b in active])
            mask = (torch.arange(L)[None, :] >= torch.tensor([L - len(hist[b]) for b in active])[:, None]).long()
            out = model.generate(input_ids=ids, attention_mask=mask, **kw)[:, L:].tolist()
        else:
            out = [model.generate(input_ids=torch.tensor([hist[b]]), **kw)[0, len(hist[b]):].tolist()
                   for b in active]
        still, turn = [], turn + 1
        for b, reply in zip(active, out):
            reply = reply[:next((i + 1 for i, t in enumerate(reply) if t in stop), len(reply))]
            generated += len(reply)
            said = tok.decode(reply, skip_special_tokens=True)
            convs[b].reply(said)
            result = envs[b].step("<think>" + said)
            hist[b] += reply
            if not result.done:
                still.append(b)
                piece = enc(convs[b].follow(user_text(turn, result.observation, envs[b].actions_left,
                                                      p.max_new_tokens, reward=result.reward)))
                hist[b] += piece[1:] if eot is not None and reply[-1:] == [eot] and piece[:1] == [eot] else piece
        active = still
    return generated


def engine_at(rev: str):
    """The rollout engine as it was at git revision `rev`: one module with ``rollout`` and
    ``SamplingParams`` (ragen2_core/rollout/engine.py before it was split into sampler.py and
    episodes.py; after it, the two files of that revision, the second reading the first)."""
    import importlib.util
    import subprocess
    from pathlib import Path

    def show(path):
        try:
            return subprocess.check_output(["git", "show", f"{rev}:{path}"], cwd=Path(__file__).parents[1],
                                           text=True, stderr=subprocess.DEVNULL)
        except subprocess.CalledProcessError:
            return None

    name = f"engine_at_{rev}"
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader=None))
    sys.modules[name] = module  # its dataclasses look their module up there
    def run(path, text):
        # The batches module was types.py before it was named for what it holds.
        text = text.replace("from ragen2_core.types import", "from ragen2_core.batches import")
        exec(compile(text, f"{rev}:{path}", "exec"), module.__dict__)

    old = show("ragen2_core/rollout/engine.py")
    if old is not None and "def rollout(" in old:
        run("ragen2_core/rollout/engine.py", old)
        return module
    run("ragen2_core/rollout/sampler.py", show("ragen2_core/rollout/sampler.py"))
    # Its import of the sampler would load today's; the revision's is already in the module.
    run("ragen2_core/rollout/episodes.py", "\n".join(
        line for line in show("ragen2_core/rollout/episodes.py").splitlines()
        if not line.startswith("from ragen2_core.rollout.sampler import")))
    return module


def timed(fn):
    t0 = time.perf_counter()
    tokens = fn()
    return time.perf_counter() - t0, tokens


def vs_vllm(args) -> None:
    from ragen2_core.envs.registry import make_env
    from ragen2_core.policy.shapes import random_qwen25
    from ragen2_core.policy.tokenizer import train_tokenizer
    from ragen2_core.policy.warmstart import expert_episode
    from ragen2_core.rollout.vllm_backend import VLLMEngine

    # A tokenizer of ours (trained on the env's expert text) under a model of the real shape: the
    # model's 151,936-way head is what costs; ids past the tokenizer decode to nothing.
    env = make_env("frozenlake", slip=0.0)
    tok = train_tokenizer([p + r for s in range(200) for p, r in expert_episode(env, s, "grounded")],
                          vocab_size=1024)
    model = random_qwen25(args.size, tokenizer=tok).eval()
    make = lambda: make_env("frozenlake", slip=0.0, max_turns=args.turns)  # noqa: E731
    seeds = list(range(args.episodes))
    p = SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens)
    t0 = time.perf_counter()
    engine = VLLMEngine(model, dtype="float32", max_context_tokens=2048, memory_gb=1.0, seed=0)
    startup = time.perf_counter() - t0

    def play(session_of, n):
        s = seeds[:n]
        b = rollout(model, tok, make, env_seeds=s, dynamics_seeds=s, group_ids=s, sampling=p,
                    generator=torch.Generator().manual_seed(0), session=session_of(len(s)))
        return sum(sum(m) for m in b.response_mask)

    ways = {"ours": lambda n: play(lambda _: None, n), "vllm": lambda n: play(engine.session, n)}
    results = {}
    for name, fn in ways.items():
        fn(4)  # warm-up: first-call costs (kernel selection, allocator) stay out of the timing
        sec, tokens = min(timed(lambda: fn(args.episodes)) for _ in range(args.repeats))
        results[name] = {"seconds": round(sec, 3), "tokens": tokens, "tokens_per_s": round(tokens / sec, 1)}
        print(f"{name:>10}: {sec:7.2f} s  {tokens:6d} tokens  {tokens / sec:8.1f} tok/s", flush=True)
    print(json.dumps({
        "name": "rollout_vs_vllm", "episodes": args.episodes, "threads": torch.get_num_threads(),
        "model": f"random-init Qwen2.5-{args.size} shape, fp32", "max_new_tokens": args.max_new_tokens,
        "turns": args.turns, "vllm_startup_s": round(startup, 1),
        "ratio": round(results["vllm"]["tokens_per_s"] / results["ours"]["tokens_per_s"], 2),
        "goal": {"ratio": 1.5}, **results}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=["hf", "vllm"], default="hf",
                    help="hf: our engine vs HF generate; vllm: our engine vs the vLLM backend")
    ap.add_argument("--size", default="0.5B", help="--backend vllm: Qwen2.5 shape of the random-init model")
    ap.add_argument("--max-new-tokens", type=int, default=32, help="--backend vllm: per-turn budget")
    ap.add_argument("--turns", type=int, default=3, help="--backend vllm: FrozenLake turns per episode")
    ap.add_argument("--config", default=None)
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--episodes", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2, help="best of N for each way")
    ap.add_argument("--skip-naive", action="store_true", help="the naive loop is slow; skip it")
    ap.add_argument("--compile", action="store_true", help="also time rollout.compile (after compiling it)")
    ap.add_argument("--against", metavar="REV", help="also time the engine of this git revision, alternately")
    ap.add_argument("--profile", action="store_true", help="then profile ours and hf_batched once each (cProfile)")
    ap.add_argument("--vllm", action="store_true", help="also time the vLLM backend on the same model and episodes "
                    "(run in the vLLM environment)")
    ap.add_argument("--vllm-memory-gb", type=float, default=2.0, help="--vllm: KV cache size")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.backend == "vllm":
        return vs_vllm(args)
    cfg = load_config(args.config, ["env.name=frozenlake", *args.overrides])
    model, tok, path = load_policy(cfg.policy, cfg.warmstart, cfg.env)
    model.eval()
    make_env = env_factory(cfg.env)
    seeds = list(range(args.episodes))
    p = SamplingParams(temperature=1.0, max_new_tokens=cfg.rollout.max_new_tokens)
    prompt_format = load_prompt_format(tok, cfg.policy.chat_template)

    def ours(compiled: bool = False, engine=None, session=None, n: int = len(seeds)):
        """Our rollout (`engine`: another version's engine module, with its own SamplingParams;
        `session`: a generation backend's sessions, e.g. vLLM's, under the same episode loop)."""
        if engine is None:
            play, sampling = rollout, replace(p, compile=compiled)
        else:
            play, sampling = engine.rollout, engine.SamplingParams(temperature=1.0, max_new_tokens=p.max_new_tokens)
        # Older revisions call the format `fmt`, and the oldest take none (raw text only).
        params = inspect.signature(play).parameters
        form = {k: prompt_format for k in ("prompt_format", "fmt") if k in params}
        n = min(n, len(seeds))
        if session is not None:
            form["session"] = session(n)
        b = play(model, tok, make_env, env_seeds=seeds[:n], dynamics_seeds=seeds[:n], group_ids=seeds[:n],
                 sampling=sampling, generator=torch.Generator().manual_seed(0), **form)
        return sum(sum(m) for m in b.response_mask)

    def hf(batched):
        torch.manual_seed(0)
        with torch.no_grad():
            return hf_driver(model, tok, make_env, seeds, p, batched=batched, prompt_format=prompt_format)

    ways = {"ours": ours, "hf_batched": lambda: hf(True)}
    if not args.skip_naive:
        ways["naive"] = lambda: hf(False)
    results, extra = {}, {}
    # First-call costs (allocator, kernel selection) would fall on whichever way runs first: one
    # short rollout on the shared model pays them before any timing.
    ours(n=4)
    if args.against:
        old, then = engine_at(args.against), f"at_{args.against}"
        pairs = [(timed(ours), timed(lambda: ours(engine=old))) for _ in range(args.repeats)]  # alternately
        for name, runs in (("ours", [a for a, _ in pairs]), (then, [b for _, b in pairs])):
            sec, tokens = min(runs)
            results[name] = {"seconds": round(sec, 3), "tokens": tokens, "tokens_per_s": round(tokens / sec, 1)}
            print(f"{name:>10}: {sec:7.2f} s  {tokens:6d} tokens  {tokens / sec:8.1f} tok/s", flush=True)
        extra[f"ratio_vs_{args.against}"] = round(results[then]["seconds"] / results["ours"]["seconds"], 2)
        ways.pop("ours")
    if args.compile:
        extra["compile_s"] = round(timed(lambda: ours(True))[0], 1)   # compiles the decode step
        ways["compiled"] = lambda: ours(True)
    if args.vllm:
        from ragen2_core.policy.lora import plain_weights
        from ragen2_core.rollout.vllm_backend import VLLMEngine
        t0 = time.perf_counter()
        engine = VLLMEngine(model, dtype="float32", max_context_tokens=cfg.rollout.max_context_tokens,
                            memory_gb=args.vllm_memory_gb, seed=0, weights=plain_weights)
        extra["vllm_startup_s"] = round(time.perf_counter() - t0, 1)
        ours(session=engine.session, n=4)  # warm-up: first-call costs stay out of the timing
        ways["vllm"] = lambda: ours(session=engine.session)
    for name, fn in ways.items():
        runs = [timed(fn) for _ in range(args.repeats)]
        sec, tokens = min(runs)
        results[name] = {"seconds": round(sec, 3), "tokens": tokens, "tokens_per_s": round(tokens / sec, 1)}
        print(f"{name:>10}: {sec:7.2f} s  {tokens:6d} tokens  {tokens / sec:8.1f} tok/s", flush=True)
    if args.profile:  # where the time goes, ours and HF's batched generate, once each
        import cProfile
        import pstats
        for name in ("ours", "hf_batched"):
            prof = cProfile.Profile()
            prof.runcall(ways[name] if name in ways else ours)
            print(f"--- {name}: the calls that take the most time of their own")
            pstats.Stats(prof).sort_stats("tottime").print_stats(6)
    ours_s = results["ours"]["seconds"]
    print(json.dumps({
        "name": "rollout", "episodes": args.episodes, "threads": args.threads, "policy": str(path),
        "ratio": round(results["naive"]["seconds"] / ours_s, 2) if "naive" in results else None,
        "ratio_vs_hf_batched": round(results["hf_batched"]["seconds"] / ours_s, 2),
        **({"compile_ratio": round(ours_s / results["compiled"]["seconds"], 2)} if args.compile else {}),
        # vLLM's tokens/s over ours: sampled replies differ in length between engines, so time per token
        **({"vllm_ratio": round(results["vllm"]["tokens_per_s"] / results["ours"]["tokens_per_s"], 2)}
           if args.vllm else {}),
        "goal": {"ratio": 8, "ratio_vs_hf_batched": 1.3, **({"vllm_ratio": 2.0} if args.vllm else {})},
        **extra, **results}))


if __name__ == "__main__":
    main()
