"""Host-device synchronisations and aten ops per generated token and per update micro-batch, on CPU.

What makes a GPU step slow at small batch is the host: every read of a device value (``.item()``,
``bool(t)``, ``.tolist()``, ``nonzero``, boolean-mask indexing) makes it wait until the device has
drained its queue, and every aten op is a launch. On a CPU both are free, which hides them; this
benchmark counts them instead of timing them (ragen2_core/rollout/syncs.py), so its numbers hold for
any device:

  decode   our engine's decode step vs HF ``generate`` on the same model and batch: syncs and ops
           per decode step (one new token for every row), from the difference of two runs of
           different lengths so that prefill and per-call costs drop out. Ours checks whether every
           row has stopped every ``--stop-every`` steps (8 as on a GPU; 1 is the CPU default).
  update   our update's syncs and ops per micro-batch (the same step cut into 2 and 4 micro-batches,
           one optimizer step either way: the difference is per micro-batch) and TRL's GRPOTrainer
           per micro-batch (its ``compute_loss`` and the ``backward`` after it), when TRL is installed
           (``pip install -e .[bench]``). Ours includes DeepSpeed's backward and its step between
           two optimizer steps; what the optimizer step itself reads is left out of both.

The model is the default embedded policy; the update runs single-turn FrozenLake, 8 groups x 8, as
benchmarks/step_vs_trl.py does. A table first, then as the last line one JSON object with
``ours_syncs_per_token``, ``hf_syncs_per_token``, ``ours_ops_per_token``, ``hf_ops_per_token``,
``update_syncs_per_microbatch`` (and ``trl_syncs_per_microbatch``).

    python benchmarks/launch_budget.py [--rows 16] [--stop-every 8] [--skip-update] [--skip-trl]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

from ragen2_core.config import load_config
from ragen2_core.policy.load import load_policy
from ragen2_core.rollout.sampler import KVSession, SamplingParams
from ragen2_core.rollout.syncs import count_syncs

sys.path.insert(0, str(Path(__file__).parent))
import step_vs_trl  # noqa: E402

SHORT, LONG = 8, 24   # decode lengths whose difference is measured
NEVER = -1            # a stop id nothing samples: every row decodes its whole budget


def prompts(tok, rows: int) -> list[list[int]]:
    """Rows of different lengths (padding inside the cache, as in a real batch)."""
    text = "Board size 4. Player at (1, 2). Goal at (3, 3). Holes at (2, 2), (0, 3). <think>"
    ids = tok.encode(text, add_special_tokens=False)
    return [ids[: len(ids) - (r % 4)] for r in range(rows)]


def ours_decode(model, tok, rows: int, steps: int, stop_every: int):
    session = KVSession(model, tok.pad_token_id)
    session.stop_every = stop_every  # set after construction, so that the same script measures older engines
    with torch.no_grad():
        logits = session.append(prompts(tok, rows))
        with count_syncs() as c:
            session.decode(logits, SamplingParams(temperature=1.0, max_new_tokens=steps),
                           torch.tensor([NEVER]), torch.Generator().manual_seed(0))
    return c


def hf_decode(model, tok, rows: int, steps: int):
    chunks = prompts(tok, rows)
    L = max(map(len, chunks))
    ids = torch.tensor([[tok.pad_token_id] * (L - len(c)) + c for c in chunks])
    attn = (ids != tok.pad_token_id).long()
    torch.manual_seed(0)
    with torch.no_grad(), count_syncs() as c:
        model.generate(input_ids=ids, attention_mask=attn, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                       max_new_tokens=steps, eos_token_id=None, pad_token_id=tok.pad_token_id)
    return c


def per_step(run) -> dict:
    short, long = run(SHORT), run(LONG)
    n = LONG - SHORT
    return {"syncs": (long.syncs - short.syncs) / n, "ops": (long.ops - short.ops) / n,
            "syncs_by_name": {k: (long.by_name[k] - short.by_name[k]) / n for k in long.by_name}}


def ours_update(grad_accum: int, threads: int) -> tuple[int, int]:
    """Syncs and ops inside the update of one GRPO step (step_vs_trl's batch), `grad_accum` micro-batches."""
    import ragen2_core.train.trainer as trainer

    counts, original = [], trainer.update

    def counted(*args, **kwargs):
        with count_syncs() as c:
            out = original(*args, **kwargs)
        counts.append(c)
        return out

    trainer.update = counted
    try:
        with tempfile.TemporaryDirectory() as d:
            step_vs_trl.ours(1, threads, d, extra=(f"train.grad_accum={grad_accum}",))
    finally:
        trainer.update = original
    return counts[0].syncs, counts[0].ops


def trl_update(threads: int) -> dict:
    """Syncs and ops per micro-batch of TRL's GRPOTrainer: its ``compute_loss`` (forward, loss,
    metrics) and the ``backward`` after it; the first step left out."""
    from accelerate import Accelerator
    from trl import GRPOTrainer

    counts: list = []

    def counting(original):
        def counted(*args, **kwargs):
            with count_syncs() as c:
                out = original(*args, **kwargs)
            counts.append(c)
            return out
        return counted

    loss, backward = GRPOTrainer.compute_loss, Accelerator.backward
    GRPOTrainer.compute_loss, Accelerator.backward = counting(loss), counting(backward)
    try:
        with tempfile.TemporaryDirectory() as d:
            step_vs_trl.trl(1, threads, d)
    finally:
        GRPOTrainer.compute_loss, Accelerator.backward = loss, backward
    micro = [counts[i] for i in range(2, len(counts) - 1, 2)], [counts[i + 1] for i in range(2, len(counts) - 1, 2)]
    n = len(micro[0])
    return {"syncs": sum(a.syncs + b.syncs for a, b in zip(*micro)) / n,
            "ops": sum(a.ops + b.ops for a, b in zip(*micro)) / n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=16, help="decode batch rows")
    ap.add_argument("--stop-every", type=int, default=8, help="our stop check cadence (8 on a GPU, 1 on CPU)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--skip-update", action="store_true", help="decode only")
    ap.add_argument("--skip-trl", action="store_true", help="no TRL even when installed")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cfg = load_config("sweeps/base/frozenlake_tiny.yaml")
    model, tok, path = load_policy(cfg.policy, cfg.warmstart, cfg.env)
    model.eval()
    ours = per_step(lambda n: ours_decode(model, tok, a.rows, n, a.stop_every))
    hf = per_step(lambda n: hf_decode(model, tok, a.rows, n))
    out = {"name": "launch_budget", "rows": a.rows, "stop_every": a.stop_every,
           "ours_syncs_per_token": ours["syncs"], "hf_syncs_per_token": hf["syncs"],
           "ours_ops_per_token": ours["ops"], "hf_ops_per_token": hf["ops"],
           "ours_syncs_by_name": ours["syncs_by_name"], "hf_syncs_by_name": hf["syncs_by_name"]}
    print(f"{'per decode step':<28}{'syncs':>8}{'ops':>8}")
    print(f"{'ours (stop check every ' + str(a.stop_every) + ')':<28}{ours['syncs']:>8.3f}{ours['ops']:>8.1f}")
    print(f"{'HF generate':<28}{hf['syncs']:>8.3f}{hf['ops']:>8.1f}")
    if not a.skip_update:
        (s2, o2), (s4, o4) = ours_update(2, a.threads), ours_update(4, a.threads)
        out |= {"update_syncs_per_microbatch": (s4 - s2) / 2, "update_ops_per_microbatch": (o4 - o2) / 2,
                "update_syncs_per_step_at_2_microbatches": s2}
        print(f"{'per update micro-batch':<28}{'syncs':>8}{'ops':>8}")
        print(f"{'ours':<28}{(s4 - s2) / 2:>8.2f}{(o4 - o2) / 2:>8.1f}   (whole update, 2 micro-batches: {s2} syncs)")
        try:
            import trl  # noqa: F401
        except ImportError:
            trl_ok = False
        else:
            trl_ok = not a.skip_trl
        if trl_ok:
            theirs = trl_update(a.threads)
            out |= {"trl_syncs_per_microbatch": theirs["syncs"], "trl_ops_per_microbatch": theirs["ops"]}
            print(f"{'TRL GRPOTrainer':<28}{theirs['syncs']:>8.2f}{theirs['ops']:>8.1f}")
        else:
            out["trl_syncs_per_microbatch"] = None
            print("TRL: not measured (not installed, or --skip-trl)")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
