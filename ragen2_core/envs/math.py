"""Math word problems as a single-turn text env: one ``<think>…</think><answer>…</answer>`` reply,
reward 1 when the answer matches the label after normalisation, else 0 (a reply without the tags
costs ``format_penalty``).

Problems come from a procedural generator of arithmetic word problems (``source="generator"``,
``difficulty`` 1-5) or a MetaMathQA-format JSON / JSONL file (``source="file"``): rows with
``query`` and ``response``, the label taken from the response's last ``The answer is: …``.

Validation is disjoint from training by content, not by seed: each problem's key (the generator's
arithmetic, the file's ``original_question`` or else ``query``) is hashed into the validation
share ``val_frac`` or the training share, and a seed at or above ``val_seed_start`` draws from the
validation share only. Rephrasings of one MetaMathQA question share an ``original_question``, so
they land on the same side. (The RAGEN release samples validation from the train split.)

    env = MathEnv(difficulty=2)
    print(env.reset(7))                            # the question
    env.step("<think>3 + 4 = 7.</think><answer>7</answer>").reward   # 1.0 or 0.0
    normalize_answer(" 3.0 ") == normalize_answer("3/1") == "3"
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import random
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from .base import RESPONSE_RE, ExpertTurn, StepResult, TextEnv

NO_ANSWER_LINE = "No answer was given in <answer>...</answer>."
LABEL = "the answer is"  # MetaMathQA responses end "The answer is: <label>"


# ============================================================================ normalisation

_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?")
_RATIO = re.compile(r"([+-]?\d+)\s*/\s*([+-]?\d+)")
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(,\d{3})+(\.\d*)?")
_WRAPPERS = re.compile(r"^(?:\\boxed|\\text|\\mathrm)\{(.*)\}$")
_FRAC = re.compile(r"\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}")


def normalize_answer(text: str) -> str:
    """Canonical form of an answer, so equal answers compare equal as strings.

    Lowercase; strip whitespace, ``$``, a trailing period and ``\\boxed{}``/``\\text{}`` wrappers;
    collapse inner whitespace; ``\\frac{a}{b}`` -> ``a/b``; ``1,000`` -> ``1000``. A number (integer,
    decimal, scientific, or ratio of integers) becomes its exact reduced fraction: ``3`` = ``3.0`` =
    ``3/1`` = ``+3`` -> ``"3"``, ``0.5`` = ``1/2`` = ``2/4`` -> ``"1/2"``. Decimals are exact, so
    ``0.333`` is not ``1/3``. Anything else is compared as the cleaned text.
    """
    s = text.strip().lower().replace("\\!", "").replace("\\$", "").replace("$", "").strip()
    while (m := _WRAPPERS.match(s)) is not None:
        s = m.group(1).strip()
    s = _FRAC.sub(r"\1/\2", s)
    s = " ".join(s.rstrip(".").split())
    if _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    value = _as_fraction(s)
    if value is None:
        return s
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def _as_fraction(s: str) -> Fraction | None:
    if _NUMBER.fullmatch(s):
        return Fraction(s)
    m = _RATIO.fullmatch(s)
    if m and int(m.group(2)) != 0:
        return Fraction(int(m.group(1)), int(m.group(2)))
    return None


# ============================================================================ single-turn protocol

@dataclass(frozen=True)
class Problem:
    question: str      # what the observation shows
    answer: str        # the expert's answer text (the label for math)
    solution: str      # grounded reasoning: the worked steps
    key: str           # identity used for the train/validation split


def split_of(key: str, val_frac: float) -> str:
    """'val' for a stable ``val_frac`` share of keys, else 'train' (sha256, not Python's salted hash)."""
    bucket = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64
    return "val" if bucket < val_frac else "train"


class SingleTurnEnv(TextEnv):
    """One reply per episode. The grid knobs (``slip``, ``max_turns``, action budgets) do not apply
    to a one-shot answer: the episode is one turn with one "action", the answer, so the shared
    prompt reads "You have 1 actions left". Subclasses supply ``_problem`` and ``_grade``."""

    action_names: list[str] = []

    def __init__(self, *, slip: float = 0.0, max_turns: int = 1, max_actions_per_turn: int = 1,
                 max_actions: int = 1, format_penalty: float = -0.1, val_seed_start: int = 1_000_000_000,
                 val_frac: float = 0.1):
        super().__init__(slip=0.0, max_turns=1, max_actions_per_turn=1, max_actions=1, format_penalty=format_penalty)
        if not 0.0 < val_frac < 1.0:
            raise ValueError(f"val_frac must be in (0, 1), got {val_frac}")
        self.val_seed_start, self.val_frac = val_seed_start, val_frac
        self.problem: Problem | None = None

    def reset(self, seed: int, dynamics_seed: int | None = None) -> str:
        """The problem of ``seed``; seeds >= ``val_seed_start`` draw from the validation share."""
        self.problem = self._problem(seed, "val" if seed >= self.val_seed_start else "train")
        self._turn, self._n_actions, self._done = 0, 0, False
        return self.render()

    def render(self) -> str:
        return self.problem.question

    def step(self, response: str) -> StepResult:
        if self._done:
            raise RuntimeError("episode is over; call reset() first")
        self._turn, self._n_actions, self._done = 1, 1, True
        m = RESPONSE_RE.search(response)
        if m is None or not m.group(2).strip():
            info = dict(format_valid=False, turn=1, terminated_reason="format", **self._no_answer_info())
            return StepResult(f"{NO_ANSWER_LINE}\n{self.render()}", self.format_penalty, True, False, info)
        reward, success, verdict, info = self._grade(m.group(2))
        info = dict(format_valid=True, turn=1, terminated_reason="success" if success else "wrong", **info)
        return StepResult(f"{verdict}\n{self.render()}", round(reward, 6), True, success, info)

    def expert_turn(self, style: str) -> ExpertTurn:
        if style not in ("grounded", "template"):
            raise ValueError(f"unknown style {style!r}; choose 'grounded' or 'template'")
        return ExpertTurn(self.problem.solution if style == "grounded" else self.template_think,
                          [self.problem.answer])

    def _problem(self, seed: int, split: str) -> Problem:
        raise NotImplementedError

    def _grade(self, answer: str) -> tuple[float, bool, str, dict]:
        """(reward, success, one-line verdict, info) for the text inside <answer>."""
        raise NotImplementedError

    def _no_answer_info(self) -> dict:
        return {}

    # The multi-turn hooks have nothing to do in a one-shot episode.
    def _apply(self, action: str) -> tuple[float, str | None]:
        raise NotImplementedError("single-turn envs grade the whole answer in step()")

    def solve(self) -> list[str] | None:
        return [self.problem.answer]

    def _fallback_move(self) -> list[str]:
        return [self.problem.answer]

    def _grounded_think(self, plan: list[str] | None, next_actions: str) -> str:
        return self.problem.solution


def pick(problems: list[Problem], seed: int, split: str, source: str) -> Problem:
    if not problems:
        fix = "raise val_frac" if split == "val" else "lower val_frac"
        raise ValueError(f"{source} has no {split} problems; {fix} or add problems")
    return problems[seed % len(problems)]


# ============================================================================ math

NAMES = {"Ann": "She", "Ben": "He", "Cara": "She", "Dev": "He", "Eva": "She", "Finn": "He", "Gina": "She",
         "Hugo": "He"}
ITEMS = ["apple", "book", "coin", "marble", "shell", "card", "stamp", "pencil"]
# difficulty -> (operations allowed, steps, largest starting number)
LEVELS = {1: ("+", 1, 9), 2: ("+-", 1, 20), 3: ("+-*", 2, 20), 4: ("+-*/", 2, 50), 5: ("+-*/", 3, 100)}
TEMPLATE_THINK = "Let me work it out step by step."


class MathEnv(SingleTurnEnv):
    """Reward 1 for the right number (after ``normalize_answer``), else 0."""

    name = "math"
    template_think = TEMPLATE_THINK

    def __init__(self, *, source: str = "generator", path: str | None = None, difficulty: int = 1, **common):
        super().__init__(**common)
        if source not in ("generator", "file"):
            raise ValueError(f"math source must be 'generator' or 'file', got {source!r}")
        if difficulty not in LEVELS:
            raise ValueError(f"math difficulty must be one of {sorted(LEVELS)}, got {difficulty}")
        if source == "file":
            if not path:
                raise ValueError("math source 'file' needs env.math.path (a MetaMathQA JSON/JSONL file)")
            load_metamath(path, self.val_frac)  # fail now, not at the first reset
        self.source, self.path, self.difficulty = source, path, difficulty

    def system_prompt(self) -> str:
        return ("You are a math solver.\n"
                "Solve the problem. Reason briefly in <think>, then give only the final number in "
                "<answer>, with no units or words.\n"
                "Example: <answer>42</answer>")

    def _problem(self, seed: int, split: str) -> Problem:
        if self.source == "file":
            return pick(load_metamath(self.path, self.val_frac)[split], seed, split, self.path)
        rng = random.Random(seed)
        while True:  # redraw until the arithmetic falls in the requested share
            problem = generate_problem(rng, self.difficulty)
            if split_of(problem.key, self.val_frac) == split:
                return problem

    def _grade(self, answer: str) -> tuple[float, bool, str, dict]:
        got, want = normalize_answer(answer), normalize_answer(self.problem.answer)
        ok = got == want
        return float(ok), ok, "Correct." if ok else "Incorrect.", {"answer": got, "correct": ok}

    def _no_answer_info(self) -> dict:
        return {"answer": None, "correct": False}


def generate_problem(rng: random.Random, difficulty: int) -> Problem:
    """A short story on one quantity: a start, then ``steps`` operations, then the question."""
    ops, steps, top = LEVELS[difficulty]
    name, item = rng.choice(list(NAMES)), rng.choice(ITEMS)
    pron = NAMES[name]
    value = rng.randint(1, top)
    sentences, work, key = [f"{name} has {value} {item}s."], [], [str(value)]
    for _ in range(steps):
        op = rng.choice(ops)
        divisors = [d for d in range(2, 10) if value % d == 0]
        if op == "-" and value < 2 or op == "/" and not divisors:
            op = "+"
        if op == "+":
            b = rng.randint(1, top)
            sentences.append(f"{pron} gets {b} more.")
            new, sym = value + b, "+"
        elif op == "-":
            b = rng.randint(1, value - 1)
            sentences.append(f"{pron} gives away {b}.")
            new, sym = value - b, "-"
        elif op == "*":
            b = rng.randint(2, 5)
            sentences.append(f"Then {pron.lower()} has {b} times as many.")
            new, sym = value * b, "*"
        else:
            b = rng.choice(divisors)
            sentences.append(f"{pron} splits them into {b} equal piles and keeps one pile.")
            new, sym = value // b, "/"
        work.append(f"{value} {sym} {b} = {new}.")
        key.append(f"{sym}{b}")
        value = new
    sentences.append(f"How many {item}s does {name} have now?")
    return Problem(" ".join(sentences), str(value), " ".join(work), " ".join(key))


@functools.lru_cache(maxsize=8)
def load_metamath(path: str, val_frac: float) -> dict[str, list[Problem]]:
    """{'train': [...], 'val': [...]} from a MetaMathQA JSON (a list) or JSONL file. Rows without a
    ``The answer is`` label are skipped; a file with none usable is an error."""
    rows = read_rows(path)
    out: dict[str, list[Problem]] = {"train": [], "val": []}
    for i, row in enumerate(rows):
        query, response = row.get("query") or row.get("question"), row.get("response")
        if not isinstance(query, str) or not isinstance(response, str):
            raise ValueError(f"{path}: row {i} needs string fields 'query' and 'response' (MetaMathQA format), "
                             f"got keys {sorted(row)}")
        at = response.lower().rfind(LABEL)
        label = response[at + len(LABEL):].lstrip(": \t").strip().split("\n")[0].strip() if at >= 0 else ""
        if not label:
            continue
        solution = " ".join(response[:at].split())
        key = row.get("original_question") or query
        out[split_of(key, val_frac)].append(Problem(query.strip(), label, solution, key))
    if not out["train"] and not out["val"]:
        raise ValueError(f"{path}: no row has a 'The answer is: ...' label in its response")
    return out


DATA_CAP_VARIABLE = "RAGEN2_MAX_DATA_MB"
DEFAULT_DATA_CAP_MB = 1024  # rows are held in memory, several times the file's size


def data_cap_bytes() -> int:
    """The largest data file read (env problem files, ``ragen2 mi``'s rollouts): $RAGEN2_MAX_DATA_MB MiB,
    else DEFAULT_DATA_CAP_MB."""
    raw = os.environ.get(DATA_CAP_VARIABLE, "")
    return (int(raw) if raw.isdigit() and int(raw) > 0 else DEFAULT_DATA_CAP_MB) << 20


def data_size_problem(p: Path) -> str | None:
    """Why the file ``p`` is too large to read (None when it is within the cap)."""
    size, cap = p.stat().st_size, data_cap_bytes()
    if size <= cap:
        return None
    return (f"{p}: {size / 2**20:,.0f} MiB, over the {cap >> 20:,} MiB cap on a data file (its rows are held "
            f"in memory); use a smaller file or a subset of it, or raise the cap with {DATA_CAP_VARIABLE}=N (MiB)")


def read_rows(path: str) -> list[dict]:
    """Rows of a JSON list or a JSONL file (one object per line), at most ``data_cap_bytes()`` of it.
    JSONL is read line by line; a JSON list (or a single object) is parsed whole."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"problem file not found: {p}; set the env's path to an existing JSON/JSONL file")
    too_big = data_size_problem(p)
    if too_big:
        raise ValueError(too_big)
    with p.open("rb") as f:
        start = f.read(64).lstrip()[:1]
        f.seek(0)
        rows = _json_rows(f, p) if start == b"[" else _jsonl_rows(f, p)
    if not all(isinstance(r, dict) for r in rows):
        raise ValueError(f"{p}: every row must be a JSON object")
    return rows


def _json_rows(f, p: Path) -> list:
    try:
        data = json.load(f)
    except ValueError as e:  # also bytes that are not UTF-8
        raise ValueError(f"{p}: neither a JSON list nor JSONL ({e})") from None
    return data if isinstance(data, list) else [data]


def _jsonl_rows(f, p: Path) -> list:
    rows = []
    for n, line in enumerate(f, start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except ValueError as e:
            if not rows:  # perhaps one JSON object over several lines
                f.seek(0)
                return _json_rows(f, p)
            raise ValueError(f"{p}: neither a JSON list nor JSONL (line {n}: {e})") from None
    return rows
