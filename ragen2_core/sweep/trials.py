"""Expansion of a sweep spec into trials, stable trial ids, and validation of every trial config.

    from ragen2_core.sweep.trials import load_spec

    spec, trials = load_spec("ablations/kl_vs_filter.yaml")   # raises SpecError listing every problem
    count_trials(spec)                                          # the size, counted without expanding
    spec, first, n = preview_spec(path, rows=20)               # the first trials of a spec of any size
    for t in trials:
        t.trial_id, t.arm, t.seed, t.values      # values: every varied key of this trial
        trial_config(spec, t)                      # exactly the config the trial trains with

Overrides are applied in this order: whole-section presets (`filter: paper`), then fixed, the
arm's fields, axes, zip, sampled values, seed; last the keys the sweep sets for each trial
(its output folder, <instance>/trials/<trial id>, is set by `trial_config`).
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import itertools
import json
import math
import random
import re
from pathlib import Path
from typing import Any, Iterator, Optional

# read_yaml: config.py's own reader of a YAML file and its `base:` chain, for the spec hash.
from ragen2_core import presets
from ragen2_core.config import ConfigError, TrainConfig, load_config, read_yaml
from ragen2_core.sweep.spec import OPERATIONAL, SpecError, SpecErrors, SweepSpec, key_sources, parse_spec


MAX_TRIALS = 1000  # trials a sweep may expand to unless --max-trials says more: each is a training run


@dataclasses.dataclass
class Trial:
    trial_id: str
    arm: str
    seed: int
    values: dict[str, Any]        # every key varied across trials (axes, zip, sampled), for tables and tags
    overrides: list[str]          # `key=json` strings, in application order, for load_config

    @property
    def group(self) -> str:
        """The trial without its seed: what results are averaged over."""
        return " ".join([self.arm] + [f"{k}={_short(v)}" for k, v in self.values.items()])

    @property
    def label(self) -> str:
        return f"{self.group} seed={self.seed}"


def _short(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


# ----------------------------------------------------------------------------- expansion

def _override(key: str, value) -> str:
    return f"{key}={json.dumps(value)}"  # JSON scalars and lists are valid YAML, so load_config parses them back


def trial_config(spec: SweepSpec, trial: Trial) -> TrainConfig:
    """The config ``trial`` trains with, resolved once per process (the driver, its tracker and
    progress, and each trial's worker all read it from here); a copy, so no reader changes another's.

    Its output folder is the one thing that depends on the instance, which is only known once the
    spec has been validated; so it is set here, on the copy, and trials are expanded once."""
    cfg = copy.deepcopy(_resolved(str(spec.base_path), tuple(trial.overrides)))
    cfg.train.output_dir = str(trial_dir(spec, trial))
    return cfg


def trial_dir(spec: SweepSpec, trial: Trial) -> Path:
    """<storage>/<name>/<instance>/trials/<trial id>: the trial's checkpoints, logs and config."""
    return spec.sweep_dir / "trials" / trial.trial_id


@functools.lru_cache(maxsize=4096)
def _resolved(base: str, overrides: tuple[str, ...]):
    return load_config(base, list(overrides))


def trial_id(arm: str, arm_overrides: dict, values: dict, seed: int) -> str:
    blob = json.dumps({"arm": arm, "set": arm_overrides, "values": values, "seed": seed}, sort_keys=True)
    return f"{arm}-{hashlib.sha1(blob.encode()).hexdigest()[:8]}"


def make_trial(spec: SweepSpec, arm: str, values: dict, seed: int) -> Trial:
    """One trial; the last overrides are the ones the sweep itself controls."""
    arm_over = spec.arms.get(arm, {})
    tid = trial_id(arm, arm_over, values, seed)
    ordered = list(spec.fixed.items()) + list(arm_over.items()) + list(values.items())
    own = [("train.seed", seed), ("train.threads", spec.threads), ("train.resume", True)]
    return Trial(tid, arm, seed, dict(values), [_override(k, v) for k, v in presets.sections_first(ordered) + own])


def _draws(space: dict[str, tuple[str, list]], n: int, seed: int) -> Iterator[dict]:
    """The random search's points, one at a time (the same sequence on every call)."""
    rng = random.Random(seed)
    for _ in range(n):
        point = {}
        for key, (kind, args) in space.items():
            if kind == "uniform":
                point[key] = rng.uniform(*args)
            elif kind == "loguniform":
                point[key] = math.exp(rng.uniform(math.log(args[0]), math.log(args[1])))
            elif kind == "randint":
                point[key] = rng.randrange(int(args[0]), int(args[1]))  # high exclusive, like tune.randint
            else:
                point[key] = rng.choice(args)
        yield point


def factors(spec: SweepSpec) -> dict[str, int]:
    """How many values each factor of the expansion has; their product is the number of trials."""
    out = {"arms": max(1, len(spec.arms))}
    out |= {f"axes.{k}": len(v) for k, v in spec.axes.items()}
    out |= {f"zip[{i}]": len(next(iter(g.values()))) for i, g in enumerate(spec.zip)}
    if spec.search.kind != "grid":  # optuna: one trial per sample, proposed at run time
        out["search.samples"] = spec.search.samples
    return out | {"seeds": len(spec.seeds)}


def count_trials(spec: SweepSpec) -> int:
    """The number of training runs the spec asks for, counted without building any."""
    return math.prod(factors(spec).values())


def iter_trials(spec: SweepSpec) -> Iterator[Trial]:
    """Arms x axes (product) x zip groups (product over groups, rows together) x seeds, one trial at a
    time, so a sweep of any size can be previewed (``itertools.islice``) without building it.

    For random search the drawn points of `search.space` are one more product factor; for optuna
    the expansion is the single template trial the sampled values are added to at run time.
    """
    zip_rows = [[dict(zip(group, vals)) for vals in zip(*group.values())] for group in spec.zip]
    for arm in spec.arms or {"base": {}}:
        for combo in itertools.product(*spec.axes.values()):
            a = dict(zip(spec.axes, combo))
            for rows in itertools.product(*zip_rows):
                z = {k: v for row in rows for k, v in row.items()}
                sampled = _draws(spec.search.space, spec.search.samples, spec.search.seed) \
                    if spec.search.kind == "random" else [{}]
                for s in sampled:
                    for seed in spec.seeds:
                        yield make_trial(spec, arm, a | z | s, seed)


def expand(spec: SweepSpec) -> list[Trial]:
    """Every trial of the spec (``iter_trials``), in order."""
    return list(iter_trials(spec))


def run_order(spec: SweepSpec, trials: list[Trial]) -> list[Trial]:
    """The order trials start in: seed by seed, each seed's block holding every arm and cell in
    expansion order. A sweep cut short then holds whole blocks, each cell with the same seeds, and
    whatever changes while it runs (the machine it resumes on, the load beside it) falls on every
    arm alike instead of on the arms that happen to run last: the seeds are the blocks of a block
    design."""
    rank = {seed: i for i, seed in enumerate(spec.seeds)}
    return sorted(trials, key=lambda t: rank.get(t.seed, len(rank)))


def validate_trials(spec: SweepSpec, trials: list[Trial], err: Optional[SpecErrors] = None) -> None:
    """Build every trial's training config; raise SpecError with every distinct problem, located."""
    err = err or SpecErrors(str(spec.path), spec.text)
    found: dict[str, list[Trial]] = {}
    for t in trials:
        try:
            trial_config(spec, t)
        except ConfigError as e:
            for msg in dict.fromkeys(e.errors):  # a bad preset is reported again after every later override
                if not _UNKNOWN.search(msg):     # unknown keys were already reported once per spec entry
                    found.setdefault(msg, []).append(t)
    sources = key_sources(spec)
    for msg, bad in found.items():
        where, key = _locate(msg, sources)
        n = f" (in {len(bad)} of {len(trials)} trials, e.g. {bad[0].label})" if len(trials) > 1 else ""
        if where:
            err.add(where, msg.removeprefix(f"{key}: ") + n)
        else:
            err.items.append(f"{spec.base_path}: {msg}{n}")
    if err.items:
        raise SpecError(err.items)


_UNKNOWN = re.compile(r"^override '[^']*': (unknown key|'[^']*' is a value, not a section)")




def _locate(msg: str, sources: dict[str, tuple]) -> tuple[Optional[tuple], str]:
    """Which spec entry set the config key a training-config error is about (or its section)."""
    m = re.match(r"override '([^=']+)=", msg) or re.match(r"([A-Za-z_][\w.]*)", msg)
    if not m:
        return None, ""
    key = m.group(1)
    while key:
        if key in sources:
            return sources[key], m.group(1)
        hits = [k for k in sources if k.startswith(key + ".")]
        if hits:
            return sources[hits[0]], m.group(1)
        key = key.rpartition(".")[0]
    return None, ""


def _optuna_probes(spec: SweepSpec, template: Trial) -> list[Trial]:
    """Optuna's configs are only known at run time: check the ends of every range and every choice."""
    probes = []
    for key, (kind, args) in spec.search.space.items():
        ends = [args[0], args[1] - 1] if kind == "randint" else args  # randint's high is exclusive
        for v in ends:
            probes.append(make_trial(spec, template.arm, {key: v}, template.seed))
    return probes


def load_spec(path: str | Path, max_trials: int = MAX_TRIALS) -> tuple[SweepSpec, list[Trial]]:
    """Read, validate and expand; every trial config is checked before anything runs, and all
    problems (spec and trial configs) come back together in one SpecError. A spec of more than
    ``max_trials`` trials is refused before any is built."""
    spec, err = parse_spec(Path(path))
    if not spec.base or not spec.base_path.is_file():
        raise SpecError(err.items)  # without a base no trial config can be built
    if count_trials(spec) > max_trials:
        err.items.append(too_many(spec, max_trials))
        raise SpecError(err.items)
    trials = expand(spec)
    probes = _optuna_probes(spec, trials[0]) if spec.search.kind == "optuna" and trials else []
    validate_trials(spec, trials + probes, err)
    ids = [t.trial_id for t in trials]
    if len(set(ids)) != len(ids):
        raise SpecError([f"{spec.path}: two trials expand to the same settings; remove the duplicate axis values"])
    return spec, trials


def preview_spec(path: str | Path, rows: int) -> tuple[SweepSpec, list[Trial], int]:
    """(spec, its first ``rows`` trials, validated, and the number of trials), for a dry run of a spec
    of any size: the expansion is counted, never built."""
    spec, err = parse_spec(Path(path))
    if not spec.base or not spec.base_path.is_file() or err.items:
        raise SpecError(err.items)
    first = list(itertools.islice(iter_trials(spec), rows))
    probes = _optuna_probes(spec, first[0]) if spec.search.kind == "optuna" and first else []
    validate_trials(spec, first + probes, err)
    return spec, first, count_trials(spec)


def sweep_preflight(spec: SweepSpec, trials: list[Trial], *, memory_check: bool = True) -> list[str]:
    """What the sweep needs before its MLflow run, folders or Ray exist (train/preflight.py): a store of a
    known scheme that can be written, a storage folder outside git, and every trial's config (and
    optuna's range ends) passing the training checks. A problem shared by trials is reported once."""
    from ragen2_core.outputs import output_problems, resolve_tracking, tracking_problems
    from ragen2_core.train.preflight import build_lock_problems, config_problems

    uri, label = resolve_tracking(spec.tracking.uri)
    problems = tracking_problems(uri, label) + output_problems(spec.sweep_root, "storage")
    probes = _optuna_probes(spec, trials[0]) if spec.search.kind == "optuna" and trials else []
    found: dict[str, list[Trial]] = {}
    cache: dict = {}
    for t in trials + probes:
        cfg = trial_config(spec, t)
        for msg in config_problems(cfg, memory_check=memory_check, cache=cache, check_output=False):
            found.setdefault(msg, []).append(t)
    n = len(trials + probes)
    problems += [msg + (f" (in {len(bad)} of {n} trials, e.g. {bad[0].label})" if n > 1 else "")
                 for msg, bad in found.items()]
    return problems + build_lock_problems()


def too_many(spec: SweepSpec, max_trials: int) -> str:
    """The refusal of a spec over the trial cap: its count, where the count comes from, the override."""
    n = count_trials(spec)
    sizes = " x ".join(f"{k} {v:,}" for k, v in factors(spec).items())
    return (f"{spec.path}: the spec expands to {n:,} trials ({sizes}), over the cap of {max_trials:,}; each "
            f"trial is a training run. Shrink the axes, arms or seeds, or raise the cap with --max-trials {n} "
            "(--dry-run shows the first trials)")


def spec_hash(spec: SweepSpec) -> str:
    """Identifies what the sweep asks for: the spec and its base YAML chain, not where results go.

    Code defaults are left out on purpose, so a sweep can be resumed after a code fix; each trial's
    full resolved config is still recorded in its `ragen2.config_hash` tag and config.yaml."""
    data = {f.name: getattr(spec, f.name) for f in dataclasses.fields(SweepSpec) if f.name not in OPERATIONAL}
    blob = json.dumps([data, read_yaml(spec.base_path)], sort_keys=True, default=lambda o: dataclasses.asdict(o))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]
