"""The prompt format (REFERENCE.md section 7): how a conversation is rendered, as raw text or in the
policy's chat template.

An episode is a conversation: the env's system text, one user message per turn (the previous turn's
reward, the state, the budget line), the model's replies as assistant messages. Generation starts
inside the reasoning, after ``<think>``. The text is produced in *pieces*: the first piece is
everything before the first reply; each later piece is everything between two replies. Pieces are
tokenised one by one and the sampled reply ids are kept as they are, so the ids the policy is
trained on are exactly the ids it generated from (re-tokenising a whole transcript could merge
tokens across a boundary, or re-encode a sampled reply differently).

``RawFormat`` (``policy.chat_template: none``) is the plain format the embedded policy is trained
on. ``ChatFormat`` renders each piece with a jinja chat template as the difference between the whole
conversation rendered up to the next generation prompt and the text before it, the way veRL and
SkyRL tokenise multi-turn chats (render the history, take the delta). That is exact for templates
that only append; one that rewrites earlier turns (e.g. drops past reasoning) is refused, since no
single token sequence could then be both generated from and trained on.

    prompt_format = load_prompt_format(tok, "auto")                 # the tokenizer's template, else raw text
    conv = prompt_format.start(system, user_text(1, obs, 10, 96))   # the first piece: conv.text
    conv.reply(reply_text)                                          # what the model wrote after "<think>"
    piece = conv.follow(user_text(2, obs2, 9, 96, reward=0.0))
"""
from __future__ import annotations

import re
from pathlib import Path

THINK = "<think>"


def user_text(turn: int, observation: str, actions_left: int, max_new_tokens: int,
              reward: float | None = None) -> str:
    """One turn's user message; every turn after the first opens with the previous turn's reward."""
    head = "" if reward is None else f"Reward: {reward:g}\n"
    return (f"{head}Turn {turn}:\nState:\n{observation}\n"
            f"You have {actions_left} actions left. Always output: <think> ... </think> "
            f"<answer> ... </answer> with no extra text. Max response length: {max_new_tokens} tokens.")


class Conversation:
    """One episode's messages; ``text`` is the first piece, ``follow`` returns each later one."""

    def __init__(self, prompt_format, system: str, user: str):
        self.prompt_format = prompt_format
        self.messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        self.text = prompt_format.first(self.messages)

    def reply(self, text: str) -> None:
        """Record the model's reply (its text after the ``<think>`` the piece ended with)."""
        self.messages.append({"role": "assistant", "content": THINK + text})

    def follow(self, user: str) -> str:
        """The piece after the last reply up to the next one, which answers ``user``."""
        piece = self.prompt_format.between(self.messages, user)
        self.messages.append({"role": "user", "content": user})
        return piece


class RawFormat:
    """Plain text: system text, then per turn the user message and ``<think>``."""

    name = "none"
    end_of_turn: str | None = None

    def start(self, system: str, user: str) -> Conversation:
        return Conversation(self, system, user)

    def first(self, messages: list[dict]) -> str:
        return f"{messages[0]['content']}\n{messages[1]['content']}\n{THINK}"

    def between(self, messages: list[dict], user: str) -> str:
        return f"\n{user}\n{THINK}"


class TemplateError(ValueError):
    """A chat template that the incremental rendering cannot use."""


class ChatFormat(RawFormat):
    """A jinja chat template, rendered through the tokenizer's ``apply_chat_template``."""

    name = "chat"

    def __init__(self, tokenizer, template: str, source: str = "the tokenizer's chat template"):
        self.tokenizer, self.template, self.source = tokenizer, template, source
        probe = self.render([{"role": "system", "content": "S"}, {"role": "user", "content": "U"},
                             {"role": "assistant", "content": THINK + "R"}], generation=False)
        if THINK + "R" not in probe:
            raise TemplateError(f"{source} does not render an assistant message's content verbatim; "
                                f"use a template that does (e.g. ChatML) or policy.chat_template=none.")
        after = probe[probe.rindex(THINK + "R") + len(THINK) + 1:]
        # The text the template closes a reply with (ChatML's <|im_end|>), when it is one token: the
        # policy may emit it itself, and then the next piece must not repeat it.
        added = sorted(tokenizer.get_added_vocab(), key=len, reverse=True)
        self.end_of_turn = next((t for t in added if t and after.startswith(t)), None)

    def render(self, messages: list[dict], *, generation: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, chat_template=self.template, tokenize=False,
                                                  add_generation_prompt=generation)

    def first(self, messages: list[dict]) -> str:
        return self.render(messages, generation=True) + THINK

    def between(self, messages: list[dict], user: str) -> str:
        before = self.render(messages[:-1], generation=True) + messages[-1]["content"]
        after = self.render(messages + [{"role": "user", "content": user}], generation=True)
        if not after.startswith(before):
            raise TemplateError(
                f"{self.source} rewrites earlier turns when a message is added (it renders the "
                f"conversation so far differently once it continues), so the ids generated from could "
                f"not be the ids trained on; use a template that only appends, or "
                f"policy.chat_template=none.")
        return after[len(before):] + THINK


RAW = RawFormat()


def first_chunk(system: str, observation: str, actions_left: int, max_new_tokens: int) -> str:
    """The raw format's first piece (what the embedded policy's warm start is trained on)."""
    return RAW.start(system, user_text(1, observation, actions_left, max_new_tokens)).text


def next_chunk(reward: float, turn: int, observation: str, actions_left: int,
               max_new_tokens: int) -> str:
    """The raw format's piece before turn ``turn``'s reply."""
    return RAW.between([], user_text(turn, observation, actions_left, max_new_tokens, reward=reward))


def template_markers(template: str) -> list[str]:
    """The ``<|...|>`` control strings a template writes (ChatML's <|im_start|>, <|im_end|>)."""
    return sorted(set(re.findall(r"<\|[A-Za-z0-9_]+\|>", template)))


def read_template(setting: str) -> str | None:
    """The template text for a ``policy.chat_template`` path (None for auto/none)."""
    if setting in ("auto", "none"):
        return None
    path = Path(setting).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"policy.chat_template: file {setting!r} not found; give auto, none or "
                                f"the path of a jinja chat template.")
    return path.read_text(encoding="utf-8")


def load_prompt_format(tokenizer, setting: str = "auto") -> RawFormat:
    """The format for ``policy.chat_template``: ``auto`` = the tokenizer's own template when it has
    one, else raw text; ``none`` = raw text; a path = that jinja file."""
    if setting == "none":
        return RAW
    if setting == "auto":
        template = getattr(tokenizer, "chat_template", None)
        return ChatFormat(tokenizer, template) if template else RAW
    return ChatFormat(tokenizer, read_template(setting), source=f"chat template {setting!r}")
