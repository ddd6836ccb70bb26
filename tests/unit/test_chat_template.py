"""Chat templates: the conversation rendered piece by piece, the ids trained on = the ids generated from.

A tokenizer of ours carries a ChatML template of the Qwen2.5 form (ragen2_core/policy/templates/
chatml.jinja) and sits beside a random-init model of Qwen2.5's config shape, saved as a plain HF
directory, so it loads the way a downloaded Qwen checkpoint does (AutoTokenizer). No downloads.
"""
import pytest
import torch

from ragen2_core.envs.registry import make_env
from ragen2_core.policy.model import load_pretrained
from ragen2_core.policy.shapes import QWEN25, qwen25_config, save_random_qwen25
from ragen2_core.policy.tokenizer import train_tokenizer
from ragen2_core.policy.warmstart import expert_episode, reply_text
from ragen2_core.rollout.cross_score import first_turn_reasonings
from ragen2_core.rollout.episodes import rollout
from ragen2_core.rollout.sampler import SamplingParams
from ragen2_core.rollout.prompt import (RAW, ChatFormat, TemplateError, first_chunk, next_chunk,
                                        load_prompt_format, template_markers, user_text)

CHATML = "ragen2_core/policy/templates/chatml.jinja"


def fl():
    return make_env("frozenlake", slip=0.0, max_turns=4)


@pytest.fixture(scope="module")
def chat_policy(tmp_path_factory):
    """(model, tokenizer as loaded from disk) of a tiny Qwen2.5-shaped model with a ChatML tokenizer."""
    template = open(CHATML).read()
    env, texts = fl(), []
    for s in range(40):
        for piece, reply in expert_episode(env, s, "grounded"):
            texts.append(piece + reply)
    tok = train_tokenizer(texts, vocab_size=400, specials=template_markers(template))
    tok.chat_template = template
    path = save_random_qwen25(tmp_path_factory.mktemp("qwen") / "tiny", "tiny", tok)
    model, loaded = load_pretrained(str(path))
    return model.eval(), loaded


def whole(tok, messages):
    """The whole conversation rendered at once, stopping after the last reply's content."""
    text = tok.apply_chat_template(messages, tokenize=False, continue_final_message=True)
    return tok.encode(text, add_special_tokens=False)


def test_raw_format_is_unchanged():
    # The embedded policy is trained on these exact strings; the cached policies depend on them.
    assert first_chunk("SYS", "OBS", 7, 96) == (
        "SYS\nTurn 1:\nState:\nOBS\nYou have 7 actions left. Always output: <think> ... </think> "
        "<answer> ... </answer> with no extra text. Max response length: 96 tokens.\n<think>")
    assert next_chunk(-0.5, 2, "OBS2", 5, 64) == (
        "\nReward: -0.5\nTurn 2:\nState:\nOBS2\nYou have 5 actions left. Always output: <think> ... "
        "</think> <answer> ... </answer> with no extra text. Max response length: 64 tokens.\n<think>")


def test_config_shape_is_qwen25():
    c = qwen25_config("0.5B")
    # Qwen2.5-0.5B-Instruct's config.json: 896 wide, 24 layers, 14 heads over 2 KV heads, 151,936 tokens.
    assert (c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.num_attention_heads,
            c.num_key_value_heads, c.vocab_size, c.tie_word_embeddings, c.rope_parameters["rope_theta"]) == (
        896, 4864, 24, 14, 2, 151936, True, 1_000_000.0)
    tiny = qwen25_config("tiny")
    assert tiny.to_dict().keys() == c.to_dict().keys()
    assert set(QWEN25) >= {"tiny", "0.5B", "1.5B", "3B"}


def test_auto_none_and_path(chat_policy):
    _, tok = chat_policy
    assert load_prompt_format(tok, "none") is RAW
    prompt_format = load_prompt_format(tok, "auto")
    assert isinstance(prompt_format, ChatFormat) and prompt_format.end_of_turn == "<|im_end|>"
    assert isinstance(load_prompt_format(tok, CHATML), ChatFormat)
    tok_without = train_tokenizer(["a b c"], vocab_size=280)
    assert load_prompt_format(tok_without, "auto") is RAW       # the embedded tokenizer has no template
    with pytest.raises(FileNotFoundError, match="chat_template"):
        load_prompt_format(tok, "no/such/template.jinja")


def test_first_piece_is_template_header_and_think(chat_policy):
    _, tok = chat_policy
    conv = load_prompt_format(tok, "auto").start("SYS", "USER")
    assert conv.text == ("<|im_start|>system\nSYS<|im_end|>\n<|im_start|>user\nUSER<|im_end|>\n"
                         "<|im_start|>assistant\n<think>")
    conv.reply("r</think><answer>Up</answer>")
    assert conv.follow("U2") == "<|im_end|>\n<|im_start|>user\nU2<|im_end|>\n<|im_start|>assistant\n<think>"


@pytest.mark.parametrize("loaded", [False, True], ids=["fast-tokenizer", "as-loaded-from-disk"])
def test_pieces_equal_whole_rendering_for_canonical_replies(chat_policy, loaded):
    """Expert replies are canonical (their ids are the encoding of their text), so the turn-by-turn ids
    must equal the whole conversation rendered and tokenised at once: every boundary is a special or
    added token (<|im_end|>, <|im_start|>, <think>), and BPE does not merge across those."""
    _, tok = chat_policy
    if not loaded:
        tok = train_tokenizer(["Turn State Reward " * 20], vocab_size=300,
                              specials=template_markers(open(CHATML).read()))
        tok.chat_template = open(CHATML).read()
    prompt_format = load_prompt_format(tok, "auto")
    enc = lambda t: tok.encode(t, add_special_tokens=False)  # noqa: E731
    env = fl()
    multi = 0
    for seed in range(12):
        obs = env.reset(seed)
        conv = prompt_format.start(env.system_prompt(), user_text(1, obs, env.actions_left, 96))
        ids, turn = enc(conv.text), 1
        while True:
            e = env.expert_turn("grounded")
            reply = reply_text(e.think, e.actions)
            ids += enc(reply)
            conv.reply(reply)
            result = env.step("<think>" + reply)
            if result.done or turn == env.max_turns:
                break
            turn += 1
            ids += enc(conv.follow(user_text(turn, result.observation, env.actions_left, 96,
                                             reward=result.reward)))
        multi += turn > 1
        assert ids == whole(tok, conv.messages)
    assert multi >= 3  # the boundaries between turns were exercised


def test_rollout_ids_are_the_pieces_and_the_sampled_replies(chat_policy, check_rollout_ids):
    """A random policy samples replies whose ids are often not the canonical encoding of their text.
    Re-rendering the whole conversation would then tokenise them differently; we keep the ids as
    sampled, and everything between the replies is exactly the template's pieces."""
    model, tok = chat_policy
    prompt_format = load_prompt_format(tok, "auto")
    enc = lambda t: tok.encode(t, add_special_tokens=False)  # noqa: E731
    batch = rollout(model, tok, fl, env_seeds=[1, 1, 2, 2, 3, 3], dynamics_seeds=list(range(6)),
                    group_ids=[0, 0, 1, 1, 2, 2], sampling=SamplingParams(max_new_tokens=10),
                    generator=torch.Generator().manual_seed(0), prompt_format=prompt_format)
    replies = check_rollout_ids(batch, tok, prompt_format)
    rewritten = 0
    for b, row in enumerate(replies):
        canonical = [enc(tok.decode(r, skip_special_tokens=False)) == r for r in row]
        if not all(canonical):
            rewritten += 1
            assert whole(tok, batch.messages[b]) != batch.token_ids[b]  # what re-rendering would have trained on
    assert rewritten >= 1


def test_mi_context_is_everything_before_the_first_reasoning(chat_policy):
    model, tok = chat_policy
    batch = rollout(model, tok, fl, env_seeds=[5, 6], dynamics_seeds=[5, 6], group_ids=[0, 1],
                    sampling=SamplingParams(max_new_tokens=8), generator=torch.Generator().manual_seed(1),
                    prompt_format=load_prompt_format(tok, "auto"))
    contexts, _ = first_turn_reasonings(batch, [0, 1])
    for c in contexts:
        text = tok.decode(c)
        assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n<think>")


def test_reply_closed_by_end_of_turn_parses_and_stops(chat_policy):
    _, tok = chat_policy
    env = fl()
    env.reset(0)
    ids = tok.encode("<think>x</think><answer>Down</answer><|im_end|>", add_special_tokens=False)
    result = env.step(tok.decode(ids, skip_special_tokens=True))
    assert result.info["format_valid"]


def test_template_that_rewrites_history_is_refused(chat_policy):
    _, tok = chat_policy
    # Drops every earlier reply's reasoning, as some reasoning models' templates do.
    template = ("{% for m in messages %}{% if m.role == 'assistant' and not loop.last %}"
                "<|im_start|>assistant\n{{ m.content.split('</think>')[-1] }}<|im_end|>\n"
                "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    conv = ChatFormat(tok, template).start("S", "U")
    conv.reply("because</think><answer>Up</answer>")
    with pytest.raises(TemplateError, match="rewrites earlier turns"):
        conv.follow("U2")


def test_cache_key_of_embedded_policies_unchanged_unless_a_template_is_given(tmp_path):
    from ragen2_core.config import load_config
    from ragen2_core.policy.warmstart import cache_key
    key = lambda *o: cache_key(*(lambda c: (c.policy, c.warmstart, c.env))(load_config(None, list(o))))  # noqa: E731
    # The default config's key before policy.chat_template existed: the cached policies stay valid.
    assert key() == key("policy.chat_template=auto") == key("policy.chat_template=none") == "89ce9b53e755"
    copy = tmp_path / "same.jinja"
    copy.write_text(open(CHATML).read())
    assert key(f"policy.chat_template={CHATML}") == key(f"policy.chat_template={copy}") != key()


def test_missing_template_file_is_a_config_error():
    from ragen2_core.config import ConfigError, load_config
    with pytest.raises(ConfigError, match=r"policy.chat_template: file 'nope.jinja' not found"):
        load_config(None, ["policy.chat_template=nope.jinja"])
