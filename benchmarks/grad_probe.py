"""Gradient probe cost: the whole batch derived from its spread bands vs measured on its own.

A random-init model of the embedded default's shape (hidden 128, 4 layers), a batch shaped like the
study's (32 rows of about 320 tokens, the last 60 of each a reply), entropy bonus on, KL off, two
spread bands. In one process, alternating:
  separate   gradient_probe over [all rows, band 0, band 1]: every row differentiated twice
  derived    accumulate over the two bands, the whole batch as their weighted sum (what
             probe_batch does): every row once
``ratio`` = separate s / derived s; ``max_rel_diff`` between the two whole-batch norms must be tiny
(the default loss is a mean over sequences). The last line printed is one JSON object.

    python benchmarks/grad_probe.py [--threads 2] [--repeats 3] [--rows 32] [--length 320]
"""
from __future__ import annotations

import argparse
import json
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from ragen2_core.algo.objective import Objective
from ragen2_core.metrics.gradients import decomposition_stats
from ragen2_core.train.grad_probe import accumulate, combine, gradient_probe
from ragen2_core.batches import PreparedBatch


def batch(rows: int, length: int, reply: int, vocab: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(length - 40, length + 1, (rows,), generator=g)
    ids = torch.randint(2, vocab, (rows, length), generator=g)
    attn = (torch.arange(length)[None] < lengths[:, None]).long()
    mask = torch.zeros(rows, length - 1)
    for b, n in enumerate(lengths.tolist()):
        mask[b, n - 1 - reply:n - 1] = 1.0
    adv = torch.randn(rows, 1, generator=g).expand(rows, length - 1) * mask
    return PreparedBatch(input_ids=ids * attn, attention_mask=attn, mask=mask, advantages=adv.contiguous(),
                         lengths=lengths)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--length", type=int, default=320)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=600, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
                                         num_key_value_heads=2, intermediate_size=384, tie_word_embeddings=True))
    prep = batch(args.rows, args.length, reply=60, vocab=600)
    obj = Objective(clip_low=0.2, clip_high=0.28, clip_ratio_c=3.0, agg="seq-mean-token-mean", norm_len=None,
                    entropy_coef=0.001, kl_coef=0.0, kl_estimator="k3", kl_placement="in_loss")
    rows = torch.arange(args.rows)
    bands = [rows[: args.rows // 2], rows[args.rows // 2:]]
    times = {"separate": [], "derived": []}
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        separate = gradient_probe(model, prep, [rows, *bands], objective=obj, micro=16)
        times["separate"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        accs = [accumulate(model, prep, b, objective=obj, micro=16) for b in bands]
        derived = decomposition_stats(combine([(len(b), a) for b, a in zip(bands, accs)]))
        times["derived"].append(time.perf_counter() - t0)
    diff = max(abs(derived[k] - separate[0][k]) / max(abs(separate[0][k]), 1e-12)
               for k in ("grad_norm_task", "grad_norm_entropy"))
    best = {k: min(v) for k, v in times.items()}
    for k, v in best.items():
        print(f"{k:9s} {v:.3f} s (best of {args.repeats})")
    print(json.dumps({"separate_s": round(best["separate"], 3), "derived_s": round(best["derived"], 3),
                      "ratio": round(best["separate"] / best["derived"], 2), "max_rel_diff": diff,
                      "threads": args.threads, "rows": args.rows, "length": args.length}))


if __name__ == "__main__":
    main()
