"""Log-probs and entropies through `HeadLogits` (the output head applied a chunk of positions at a
time, forward and backward) equal the full-logits path in value and gradient."""
import math

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from ragen2_core.algo.losses import HeadLogits, entropy_from_logits, logp_entropy, logp_from_logits
from ragen2_core.algo.objective import Objective, actor_terms
from ragen2_core.train.shared_prefix import forward_window, unwindow, window


def test_hand_example():
    # One position, D = 1, V = 2: h = 1, W = [[0], [ln 3]] -> logits [0, ln 3], p = [1/4, 3/4].
    # log p(token 1) = ln(3/4); H = -(1/4 ln 1/4 + 3/4 ln 3/4).
    # d logp_1 / dz = [0 - 1/4, 1 - 3/4] = [-1/4, 1/4]; dz/dh = W, so d logp_1 / dh = ln(3)/4,
    # and d logp_1 / dW = [[-1/4 * h], [1/4 * h]] = [[-1/4], [1/4]].
    h = torch.ones(1, 1, 1, requires_grad=True)
    w = torch.tensor([[0.0], [math.log(3)]], requires_grad=True)
    logp, ent = logp_entropy(HeadLogits(h, w, chunk=1), torch.tensor([[1]]))
    assert abs(logp.item() - math.log(0.75)) < 1e-6
    assert abs(ent.item() + (0.25 * math.log(0.25) + 0.75 * math.log(0.75))) < 1e-6
    logp.sum().backward()
    assert abs(h.grad.item() - math.log(3) / 4) < 1e-6
    torch.testing.assert_close(w.grad, torch.tensor([[-0.25], [0.25]]))


def _both(hidden, weight, ids, chunk):
    """(dense, chunked) (logp, entropy) of the same inputs, each on its own leaf copies."""
    out = []
    for use_head in (False, True):
        h = hidden.detach().clone().requires_grad_(True)
        w = weight.detach().clone().requires_grad_(True)
        src = HeadLogits(h, w, chunk) if use_head else torch.nn.functional.linear(h, w).float()
        out.append((h, w, *logp_entropy(src, ids)))
    return out


def test_values_and_gradients_equal_dense_path():
    torch.manual_seed(0)
    hidden, weight = torch.randn(3, 7, 16) * 3, torch.randn(50, 16)
    ids = torch.randint(0, 50, (3, 7))
    a, b = torch.randn(3, 7), torch.randn(3, 7)
    (h0, w0, lp0, e0), (h1, w1, lp1, e1) = _both(hidden, weight, ids, chunk=4)   # 21 rows: 5 full chunks + 1
    torch.testing.assert_close(lp1, lp0, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(e1, e0, atol=1e-5, rtol=1e-5)
    (a * lp0 + b * e0).sum().backward()
    (a * lp1 + b * e1).sum().backward()
    torch.testing.assert_close(h1.grad, h0.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(w1.grad, w0.grad, atol=1e-5, rtol=1e-5)


def test_unused_entropy_and_single_function_entry_points():
    torch.manual_seed(1)
    hidden, weight, ids = torch.randn(2, 5, 8), torch.randn(30, 8), torch.randint(0, 30, (2, 5))
    (h0, w0, lp0, _), (h1, w1, lp1, _) = _both(hidden, weight, ids, chunk=3)
    lp0.sum().backward()
    lp1.sum().backward()     # the entropy output is unused: its gradient never arrives
    torch.testing.assert_close(h1.grad, h0.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(w1.grad, w0.grad, atol=1e-5, rtol=1e-5)
    dense = torch.nn.functional.linear(hidden, weight)
    head = HeadLogits(hidden, weight, 3)
    assert head.shape == dense.shape
    torch.testing.assert_close(logp_from_logits(head, ids), logp_from_logits(dense, ids), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy_from_logits(head), entropy_from_logits(dense), atol=1e-5, rtol=1e-5)


def _model():
    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=60, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True))


def _rows():
    a, b = torch.randint(1, 60, (6,)).tolist(), torch.randint(1, 60, (3,)).tolist()
    rows = [a + [3, 4, 5], a + [6, 7], b + [8, 9, 10, 11], b + [1]]
    L = max(map(len, rows))
    ids, attn = torch.zeros(len(rows), L, dtype=torch.long), torch.zeros(len(rows), L, dtype=torch.long)
    for r, x in enumerate(rows):
        ids[r, :len(x)], attn[r, :len(x)] = torch.tensor(x), 1
    return ids, attn, torch.tensor([6, 6, 3, 3])


def test_model_forward_loss_and_gradients_equal_full_logits():
    """The actor's loss terms through the model, with and without a shared prompt: chunked head vs
    full logits, including the tied embedding's gradient (head and input embedding are one tensor)."""
    model = _model()
    ids, attn, prefix = _rows()
    for prefix_len in (None, prefix):
        results = []
        for chunk in (0, 3):
            model.zero_grad()
            logits, start = forward_window(model, ids, attn, prefix_len=prefix_len, logit_chunk=chunk)
            assert isinstance(logits, HeadLogits) == bool(chunk)
            w = lambda x: window(x, start, logits.shape[1])  # noqa: E731
            mask = w(attn[:, 1:].float())
            adv = w(torch.linspace(-1, 1, ids.shape[1] - 1).expand(len(ids), -1).contiguous())
            logp, entropy_tok = logp_entropy(logits, w(ids[:, 1:]))
            obj = Objective(clip_low=0.2, clip_high=0.28, clip_ratio_c=3.0, agg="token-mean", norm_len=None,
                            entropy_coef=0.1, kl_coef=0.3, kl_estimator="k3", kl_placement="in_loss")
            terms = actor_terms(obj, logp, entropy_tok, mask, None, adv, w(torch.zeros_like(adv)))
            terms["loss"].backward()
            assert model.lm_head.weight is model.model.embed_tokens.weight
            results.append((unwindow(logp.detach() * mask, start, ids.shape[1] - 1),
                            unwindow(entropy_tok.detach() * mask, start, ids.shape[1] - 1),
                            {n: p.grad.clone() for n, p in model.named_parameters()}))
        (lp0, e0, g0), (lp1, e1, g1) = results
        torch.testing.assert_close(lp1, lp0, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(e1, e0, atol=1e-5, rtol=1e-5)
        for n in g0:
            torch.testing.assert_close(g1[n], g0[n], atol=1e-5, rtol=1e-5, msg=f"gradient of {n}")
    assert isinstance(model.lm_head, torch.nn.Linear)   # the head is back in place after the forward


def test_bf16_forward_values_equal_full_logits():
    """In bf16 the head's matmul runs in bf16 either way, then float32: per-position values agree."""
    model = _model().to(torch.bfloat16)
    ids, attn, _ = _rows()
    with torch.no_grad():
        dense, _ = forward_window(model, ids, attn, logit_chunk=0)
        head, _ = forward_window(model, ids, attn, logit_chunk=5)
        for a, b in zip(logp_entropy(head, ids[:, 1:]), logp_entropy(dense, ids[:, 1:])):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_models_with_other_heads_keep_full_logits():
    model = _model()
    model.config.model_type = "gemma2"   # soft-capped logits: lm_head(h) alone would be wrong
    ids, attn, _ = _rows()
    logits, _ = forward_window(model, ids, attn, logit_chunk=4)
    assert isinstance(logits, torch.Tensor) and logits.shape == (len(ids), ids.shape[1] - 1, 60)
