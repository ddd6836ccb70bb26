"""The conversation format, one chunk of text per turn (REFERENCE.md section 7).

Turn 1's chunk is the system text plus the first state; every later chunk starts with the previous
turn's reward. Each chunk ends with ``<think>`` so generation starts inside the reasoning. Chunks
are tokenised one by one and concatenated, so the ids the policy is trained on are exactly the ids
it generated from (re-tokenising the whole transcript could merge tokens across a boundary).
"""
from __future__ import annotations


def turn_text(turn: int, observation: str, actions_left: int, max_new_tokens: int) -> str:
    return (f"Turn {turn}:\nState:\n{observation}\n"
            f"You have {actions_left} actions left. Always output: <think> ... </think> "
            f"<answer> ... </answer> with no extra text. Max response length: {max_new_tokens} tokens.\n"
            "<think>")


def first_chunk(system: str, observation: str, actions_left: int, max_new_tokens: int) -> str:
    return f"{system}\n{turn_text(1, observation, actions_left, max_new_tokens)}"


def next_chunk(reward: float, turn: int, observation: str, actions_left: int,
               max_new_tokens: int) -> str:
    return f"\nReward: {reward:g}\n{turn_text(turn, observation, actions_left, max_new_tokens)}"
