"""The embedded tokenizer: a small byte-level BPE trained on the envs' own text.

Byte-level means every string round-trips exactly (unseen text falls back to bytes); training on
observations and expert replies makes the common words single tokens, so prompts stay short for a
tiny model. The four reply tags are single tokens, which lets the rollout engine stop on
``</answer>`` by id and lets the MI diagnostic cut ``<think>`` spans without decoding.

    tok = train_tokenizer(texts, vocab_size=512)
    tok.save_pretrained(path)          # AutoTokenizer.from_pretrained(path) loads it back
"""
from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from tokenizers import AddedToken
from transformers import PreTrainedTokenizerFast

PAD, EOS = "<|pad|>", "<|endoftext|>"
TAGS = ["<think>", "</think>", "<answer>", "</answer>"]
PRE_TOKEN = r" ?\(\d+, \d+\)| ?[A-Za-z]+| ?\d| ?[^\sA-Za-z\d]+|\s*\n|\s+"


def train_tokenizer(texts: Iterable[str], *, vocab_size: int, specials: Iterable[str] = ()
                    ) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE of at most ``vocab_size`` tokens (tags and specials included).
    ``specials`` are extra special tokens: a chat template's control strings (ChatML's <|im_start|>,
    <|im_end|>) stay single tokens that decoding with ``skip_special_tokens`` drops."""
    specials = list(specials)
    bpe = Tokenizer(models.BPE())
    # A coordinate "(r, c)" is one pre-token, so BPE learns it as one token: copying a position
    # from the observation into the reasoning is then a single-token lookup, which a tiny model
    # learns far sooner than copying five aligned pieces. Other numbers split digit by digit.
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRE_TOKEN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, EOS, *specials],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer=trainer)
    # Tags are ordinary (non-special) added tokens so decode keeps them in the text.
    bpe.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAGS])
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe, pad_token=PAD, eos_token=EOS, bos_token=None, unk_token=None,
        padding_side="left", clean_up_tokenization_spaces=False,
        **({"extra_special_tokens": specials} if specials else {}),
    )
