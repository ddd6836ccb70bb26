"""Shared-prompt forward equals the plain forward: log-probs and entropies at every trained
position, and gradients."""
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from ragen2_core.algo.losses import entropy_from_logits, logp_from_logits
from ragen2_core.train.shared_prefix import forward_window, micro_batch_order, unwindow, window


def setup():
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2))
    a, b = torch.randint(1, 50, (7,)).tolist(), torch.randint(1, 50, (4,)).tolist()
    # Two prompts of different lengths (7 and 4 tokens) shared by 3 and 2 rows; continuations of
    # different lengths, one of a single token.
    rows = [a + [3, 4, 5], a + [6, 7], b + [8, 9, 10, 11], b + [1], a + [2, 2, 2, 2, 2]]
    prefix = torch.tensor([7, 7, 4, 4, 7])
    L = max(map(len, rows))
    ids = torch.zeros(len(rows), L, dtype=torch.long)
    attn = torch.zeros(len(rows), L, dtype=torch.long)
    trained = torch.zeros(len(rows), L - 1)      # next-token positions after the prompt
    for r, x in enumerate(rows):
        ids[r, :len(x)] = torch.tensor(x)
        attn[r, :len(x)] = 1
        trained[r, prefix[r] - 1:len(x) - 1] = 1
    return model, ids, attn, prefix, trained


def per_position(model, ids, attn, prefix_len):
    """Log-prob of each next token and the entropy there, [R, L-1], from the (windowed) forward."""
    logits, start = forward_window(model, ids, attn, prefix_len=prefix_len)
    targets = window(ids[:, 1:], start, logits.shape[1])
    L1 = ids.shape[1] - 1
    return (unwindow(logp_from_logits(logits, targets), start, L1),
            unwindow(entropy_from_logits(logits), start, L1), logits.shape[1])


def test_trained_positions_equal_the_plain_forward():
    model, ids, attn, prefix, trained = setup()
    with torch.no_grad():
        lp, ent, W = per_position(model, ids, attn, None)
        lp_s, ent_s, W_s = per_position(model, ids, attn, prefix)
    assert W == ids.shape[1] - 1 and W_s == 5   # the window spans the longest continuation only
    on = trained.bool()
    torch.testing.assert_close(lp_s[on], lp[on], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent_s[on], ent[on], atol=1e-5, rtol=1e-5)


def test_gradients_equal():
    model, ids, attn, prefix, trained = setup()

    def grads(prefix_len):
        model.zero_grad()
        lp, _, _ = per_position(model, ids, attn, prefix_len)
        (lp * trained).sum().backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    plain, shared = grads(None), grads(prefix)
    assert not torch.isnan(shared).any()
    torch.testing.assert_close(shared, plain, atol=1e-5, rtol=1e-4)


def test_unshared_prompts_fall_back_to_one_plain_forward():
    model, ids, attn, _, _ = setup()
    own = torch.tensor([7, 5, 4, 2, 6])  # prefixes that differ row to row: nothing to share
    logits, start = forward_window(model, ids, attn, prefix_len=own)
    assert logits.shape[1] == ids.shape[1] - 1 and not start.any()


def test_window_and_unwindow_by_hand():
    x = torch.tensor([[1., 2., 3., 4.], [5., 6., 7., 8.]])
    start = torch.tensor([1, 2])
    # row 0: positions 1, 2, 3; row 1: positions 2, 3 and one past the end (zero)
    assert window(x, start, 3).tolist() == [[2., 3., 4.], [7., 8., 0.]]
    assert unwindow(torch.tensor([[1., 1., 1.], [2., 2., 2.]]), start, 4).tolist() == [[0., 1., 1., 1.], [0., 0., 2., 2.]]


def test_micro_batch_order_keeps_groups_together():
    lengths = torch.tensor([5, 2, 4, 8, 6, 3])
    groups = torch.tensor([0, 1, 0, 1, 0, 2])
    # group maxima: g0 6, g1 8, g2 3 -> groups in order g2, g0, g1; inside a group by length
    assert micro_batch_order(lengths, groups).tolist() == [5, 2, 0, 4, 1, 3]
    # without groups: by length only
    assert micro_batch_order(lengths, None).tolist() == [1, 5, 2, 0, 4, 3]


def test_critic_values_equal_the_plain_forward_with_gradients():
    # The PPO critic is a token classifier (no cache in its output): it is handed one and shares
    # prompts the same way. Values at trained positions and the value head's gradients must agree.
    from transformers import Qwen2ForTokenClassification
    _, ids, attn, prefix, trained = setup()
    torch.manual_seed(1)
    critic = Qwen2ForTokenClassification(Qwen2Config(vocab_size=50, hidden_size=32, intermediate_size=64,
                                                     num_hidden_layers=2, num_attention_heads=4,
                                                     num_key_value_heads=2, num_labels=1, classifier_dropout=0.0))

    def values_and_grads(prefix_len):
        critic.zero_grad()
        v, start = forward_window(critic, ids, attn, prefix_len=prefix_len)
        assert v.shape[-1] == 1
        values = unwindow(v[..., 0], start, ids.shape[1] - 1)
        (values * trained).sum().backward()
        return values.detach(), torch.cat([p.grad.flatten() for p in critic.parameters()])

    (plain, g_plain), (shared, g_shared) = values_and_grads(None), values_and_grads(prefix)
    on = trained.bool()
    torch.testing.assert_close(shared[on], plain[on], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(g_shared, g_plain, atol=1e-5, rtol=1e-4)
