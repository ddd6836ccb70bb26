"""Rollouts on disk as JSONL, one episode per line, for offline MI (``ragen2 mi``, docs/mi.md).

Texts are what any scorer re-tokenises; the ``*_ids`` fields are the exact tokens under the policy's
own tokenizer (sampled tokens need not be the tokenizer's canonical encoding of their text, so only
the ids reproduce the in-training scores exactly). Fields of one line:

    version          1 (format version)
    step             training step the batch was rolled out at (1-based, as logged)
    group_id         group within that step: rows of one group share the prompt (env seed)
    env_seed         environment seed of the episode
    episode_reward   summed reward; success: whether the episode solved the task
    n_turns          turns played
    context          text before the first reasoning token (system text + first state, ends "<think>"),
                     chat-template control tokens included
    system, user     the system text and the first user message, so a scorer can render the context
                     in its own format (absent in files written before these fields)
    reasoning        first turn's reasoning text (strictly between <think> and </think>)
    reasonings       every turn's reasoning text, in order
    responses        every turn's full reply text (starts with "<think>")
    context_ids      token ids of context;  reasoning_ids: of reasoning;  reasonings_ids: per turn

    dump_rollouts(batch.select(rows), tok, "runs/x/rollouts.jsonl", step=12)
    episodes = load_rollouts("runs/x/rollouts.jsonl")
"""
from __future__ import annotations

import json
from pathlib import Path

from ragen2_core.batches import RolloutBatch

VERSION = 1
FIELDS = ("step", "group_id", "env_seed", "episode_reward", "success", "context", "reasoning",
          "reasonings", "responses", "context_ids", "reasoning_ids")


def episode_records(batch: RolloutBatch, tok, *, step: int) -> list[dict]:
    """One dict per row of ``batch`` in the format above."""
    decode = lambda ids: tok.decode(ids, skip_special_tokens=True)  # noqa: E731
    records = []
    for b, ids in enumerate(batch.token_ids):
        spans = batch.think_spans[b]
        context_ids = ids[:spans[0][0]] if spans else ids[:batch.prompt_len[b]]
        turns = [ids[s:e] for s, e in spans]
        first = turns[0] if turns else []
        records.append({
            "version": VERSION, "step": int(step), "group_id": int(batch.group_ids[b]),
            "env_seed": int(batch.env_seeds[b]), "episode_reward": float(batch.episode_reward[b]),
            "success": bool(batch.success[b]), "n_turns": int(batch.n_turns[b]),
            "context": tok.decode(context_ids), "reasoning": decode(first),
            "reasonings": [decode(t) for t in turns],
            "responses": list(batch.responses[b]) if batch.responses else [],
            "context_ids": list(context_ids), "reasoning_ids": list(first),
            "reasonings_ids": [list(t) for t in turns],
        } | ({"system": batch.messages[b][0]["content"], "user": batch.messages[b][1]["content"]}
             if batch.messages else {}))
    return records


def dump_rollouts(batch: RolloutBatch, tok, path, *, step: int) -> None:
    """Append the batch's episodes to ``path`` (created with its folders if missing).

    All lines go out in one write, so a reader never sees half a batch from a crash between rows."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(r) + "\n" for r in episode_records(batch, tok, step=step))
    with path.open("a", encoding="utf-8") as f:
        f.write(text)


def load_rollouts(path) -> list[dict]:
    """Every episode of a rollouts file, in file order; blank lines are skipped.

    Raises FileNotFoundError for a missing file and ValueError naming the line and the problem
    (not JSON, not an object, a missing field)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"rollouts file {path} not found; training writes output_dir/rollouts.jsonl when "
            f"collapse.dump_rollouts=true.")
    episodes = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{n}: not valid JSON ({err.msg} at column {err.colno}); "
                                 f"each line must be one episode object.") from None
            if not isinstance(rec, dict):
                raise ValueError(f"{path}:{n}: expected a JSON object per line, got {type(rec).__name__}.")
            missing = [k for k in FIELDS if k not in rec]
            if missing:
                raise ValueError(f"{path}:{n}: missing field(s) {', '.join(missing)}; a rollout line "
                                 f"needs {', '.join(FIELDS)} (format in ragen2_core/rollout/dump.py).")
            episodes.append(rec)
    return episodes
