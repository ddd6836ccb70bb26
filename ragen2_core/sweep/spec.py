"""Sweep spec: YAML schema and validation of the spec itself (trials.py expands it into trials).

    from ragen2_core.sweep.spec import read_spec, SpecError

    spec = read_spec("ablations/kl_vs_filter.yaml")   # raises SpecError listing every problem, located

A spec is a config diff over a training config (`base:`, relative to the spec file):

    name: kl_vs_filter
    base: ../sweeps/base/frozenlake_tiny.yaml
    fixed: {train.steps: 40}                   # applied to every trial
    axes: {algo.kl_coef: [0.0, 0.01, 0.1]}     # cartesian product
    zip: [{env.slip: [0.0, 0.2], train.steps: [40, 60]}]   # keys varied together
    arms: {nofilter: nofilter, filter: {filter: paper, filter.value: 0.8}}
    seeds: 3                                   # or a list [0, 1, 2]

Overrides are applied in this order: whole-section presets (`filter: paper`), then fixed, the
arm's fields, axes, zip, seed. A preset is therefore a starting point that dotted keys refine.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any, Optional

# The spec is built with the config's schema machinery (schema.py) and checks its keys against the
# run config (schema_problem), so spec errors read exactly like config errors.
from ragen2_core import presets
from ragen2_core.config import MAX_SEED, schema_problem
from ragen2_core.schema import ConfigError, build_section, opt
from ragen2_core.yamlio import YamlInputError, key_lines, read_yaml_file


class SpecError(ConfigError):
    """Every problem found in a spec, one per line, each with its YAML location."""

    kind = "sweep spec"


# ----------------------------------------------------------------------------- schema

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
MAX_SEEDS = 1000  # seeds per trial point; more is a typo, and each is a training run
DISTRIBUTIONS = {"uniform": 2, "loguniform": 2, "randint": 2, "choice": None}


@dataclasses.dataclass
class SearchSpec:
    kind: str = opt("grid", "grid: every trial of the expansion; random: `samples` points of `space`, "
                    "crossed with arms and seeds; optuna: `samples` trials proposed by Optuna",
                    choices=["grid", "random", "optuna"])
    samples: int = opt(1, "random/optuna: how many points of `space` to draw", ge=1)
    seed: int = opt(0, "random/optuna: sampler seed (the drawn points are part of the trial ids)", ge=0, le=MAX_SEED)
    space: dict = opt({}, "random/optuna: dotted key -> {uniform|loguniform|randint: [low, high]} or {choice: [...]}")


@dataclasses.dataclass
class SchedulerSpec:
    kind: str = opt("asha", "trial scheduler; asha stops weak trials early", choices=["asha"])
    max_t: int = opt(100, "steps after which every trial stops", ge=1)
    grace_period: int = opt(10, "steps every trial runs before it can be stopped", ge=1)
    reduction_factor: float = opt(3.0, "keep 1/reduction_factor of the trials at each rung", gt=1)


@dataclasses.dataclass
class StopperSpec:
    metric: str = opt("collapse/mi_perm_zscore_ema", "metric watched by the template-collapse stopper")
    below: float = opt(2.0, "a measurement below this counts towards the stop")
    patience: int = opt(3, "stop a trial after this many consecutive measurements below `below`", ge=1)


@dataclasses.dataclass
class ResourcesSpec:
    cpu: float = opt(1.0, "CPUs per trial; also its torch thread count (rounded up)", gt=0)
    gpu: float = opt(0.0, "GPUs per trial (fractions share a GPU); per worker when workers > 1", ge=0)
    workers: int = opt(1, "training processes per trial; > 1 runs them data-parallel under Ray Train's "
                          "TorchTrainer (cpu and gpu are then per worker)", ge=1)


@dataclasses.dataclass
class TrackingSpec:
    uri: Optional[str] = opt(None, "MLflow tracking URI; null = $MLFLOW_TRACKING_URI or sqlite mlflow.db in the cwd")
    experiment: Optional[str] = opt(None, "MLflow experiment; null = the spec name")


@dataclasses.dataclass
class RaySpec:
    address: Optional[str] = opt(None, "existing Ray cluster, e.g. auto or ray://head:10001; null = start a local one")


@dataclasses.dataclass
class SweepSpec:
    name: str = opt("", "sweep name: MLflow experiment (default), Tune experiment and output folder")
    base: str = opt("", "training config the trials start from, relative to the spec file")
    fixed: dict = opt({}, "overrides applied to every trial (dotted keys or nested sections)")
    axes: dict = opt({}, "dotted key -> list of values; the trials are their cartesian product")
    zip: list = opt([], "groups of keys varied together: [{key: [v1, v2], key2: [w1, w2]}]")
    arms: dict = opt({}, "name -> overrides mapping, or a filter preset name (" + presets.NAMES + ")")
    seeds: Any = opt(1, "list of train.seed values, or a count n meaning 0..n-1")
    search: SearchSpec = opt(SearchSpec, "how trials are chosen")
    scheduler: Optional[SchedulerSpec] = opt(None, "optional early-stopping scheduler (needs `metric`)")
    stopper: Optional[StopperSpec] = opt(None, "optional template-collapse stopper")
    resources: ResourcesSpec = opt(ResourcesSpec, "per-trial resources")
    max_concurrent: int = opt(0, "trials running at once; 0 = as many as the resources allow", ge=0)
    max_failures: int = opt(0, "retries of a failing trial before it counts as failed", ge=0)
    metric: str = opt("eval/success", "metric summarised per arm (and optimised by optuna / asha)")
    mode: str = opt("max", "whether a higher or lower `metric` is better", choices=["max", "min"])
    nan_guard: list[str] = opt(["actor/pg_loss", "actor/grad_norm"], "a NaN in any of these fails the trial")
    storage: str = opt("runs/sweeps", "where Tune state and trial outputs go (relative to the cwd)")
    tracking: TrackingSpec = opt(TrackingSpec, "MLflow")
    ray: RaySpec = opt(RaySpec, "Ray cluster")

    # read_spec also sets `path` (the spec file) and `text` (its YAML), and the driver `instance`
    # (which run of the sweep this is, docs/sweeps.md): attributes, not spec keys.
    instance = ""

    @property
    def base_path(self) -> Path:
        return (self.path.resolve().parent / self.base).resolve()

    @property
    def experiment(self) -> str:
        return self.tracking.experiment or self.name

    @property
    def sweep_root(self) -> Path:
        """<storage>/<name>: the folder holding one folder per instance."""
        return (Path(self.storage) / self.name).resolve()

    @property
    def sweep_dir(self) -> Path:
        """<storage>/<name>/<instance>: this instance's Tune state and trial outputs."""
        return self.sweep_root / self.instance if self.instance else self.sweep_root

    @property
    def threads(self) -> int:
        return max(1, int(-(-self.resources.cpu // 1)))


_FREEFORM = ("fixed", "axes", "zip", "arms", "seeds")  # sections checked here, not by the config machinery
OPERATIONAL = ("tracking", "ray", "storage")          # may change between a run and its resume


# ----------------------------------------------------------------------------- YAML locations

class SpecErrors:
    """Collects messages as `file:line: path: message`."""

    def __init__(self, file: str, text: str):
        self.file, self.lines, self.items = file, key_lines(text), []

    def add(self, path: tuple, msg: str) -> None:
        line = self.line(path)
        where = f"{self.file}:{line}" if line else self.file
        self.items.append(f"{where}: {_render(path)}: {msg}" if path else f"{where}: {msg}")

    def line(self, path: tuple) -> Optional[int]:
        """Line of the deepest known prefix; a dotted key may also be written as nested sections."""
        nested = tuple(q for p in path for q in (p.split(".") if isinstance(p, str) else [p]))
        for candidate in (path, nested):
            for n in range(len(candidate), 1, -1):
                if candidate[:n] in self.lines:
                    return self.lines[candidate[:n]]
        return self.lines.get(path[:1])


def _render(path: tuple) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


# ----------------------------------------------------------------------------- parsing

def _flat(mapping: dict, prefix: str = "") -> dict[str, Any]:
    """Nested sections to dotted keys; a dotted key may also be written directly."""
    out = {}
    for k, v in mapping.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and v:
            out.update(_flat(v, key))
        else:
            out[key] = v
    return out


def _check_keys(keys: dict[str, tuple], err: SpecErrors) -> None:
    for key, path in keys.items():
        problem = schema_problem(key)
        if problem:
            err.add(path, problem)


def _parse_seeds(raw, err: SpecErrors) -> list[int]:
    if isinstance(raw, int) and not isinstance(raw, bool):
        if not 1 <= raw <= MAX_SEEDS:
            err.add(("seeds",), f"{raw!r} is out of range; give a count from 1 to {MAX_SEEDS} or a list of "
                                "seeds, e.g. [0, 1, 2]")
            return []
        return list(range(raw))
    if isinstance(raw, list) and len(raw) > MAX_SEEDS:
        err.add(("seeds",), f"{len(raw)} seeds is over the limit of {MAX_SEEDS}; list fewer")
        return []
    if isinstance(raw, list) and raw and all(isinstance(s, int) and not isinstance(s, bool) for s in raw):
        if len(set(raw)) != len(raw):
            err.add(("seeds",), f"{raw!r} repeats a seed; list each seed once")
        bad = [s for s in raw if not 0 <= s <= MAX_SEED]
        if bad:
            err.add(("seeds",), f"{bad[0]!r} is out of range; a seed is a whole number from 0 to {MAX_SEED}")
            return []
        return list(raw)
    err.add(("seeds",), f"expected a count or a non-empty list of whole numbers, got {raw!r}; e.g. seeds: 3")
    return []


def _parse_arms(raw, err: SpecErrors) -> dict[str, dict]:
    if not isinstance(raw, dict):
        err.add(("arms",), f"expected a mapping name -> overrides, got {raw!r}; e.g. arms: {{nofilter: nofilter}}")
        return {}
    arms = {}
    for name, body in raw.items():
        if not isinstance(name, str) or not _NAME.match(name):
            err.add(("arms", name), f"arm name {name!r} must be letters, digits, '_', '.', '-'; e.g. filter_on")
            continue
        if isinstance(body, str):
            if presets.problem(body):
                err.add(("arms", name), f"{presets.problem(body)} or a mapping of overrides")
                continue
            body = {"filter": body}
        if body is None:
            body = {}
        if not isinstance(body, dict):
            err.add(("arms", name), f"expected a mapping of overrides or a preset name, got {body!r}")
            continue
        arms[name] = _flat(body)
    return arms


def _parse_axes(raw, err: SpecErrors) -> dict[str, list]:
    if not isinstance(raw, dict):
        err.add(("axes",), f"expected a mapping dotted.key -> [values], got {raw!r}; e.g. axes: {{algo.kl_coef: [0, 0.01]}}")
        return {}
    axes = {}
    for key, values in _flat(raw).items():
        if not isinstance(values, list) or not values:
            err.add(("axes", key), f"expected a non-empty list of values, got {values!r}; e.g. [0.0, 0.01]")
            continue
        twins = _repeated(values)
        if twins:
            err.add(("axes", key), f"{twins[0]!r} and {twins[1]!r} are the same setting (two identical trials "
                                   "under one label); list each value once")
            continue
        axes[key] = values
    return axes


def _repeated(values: list) -> tuple | None:
    """The first two values that configure the same thing (0 and 0.0; not true and 1), or None."""
    def setting(v):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return (type(v).__name__, repr(v))
        return ("number", float(v))
    seen = {}
    for v in values:
        key = setting(v)
        if key in seen:
            return seen[key], v
        seen[key] = v
    return None


def _parse_zip(raw, err: SpecErrors) -> list[dict[str, list]]:
    if not isinstance(raw, list):
        err.add(("zip",), f"expected a list of groups, got {raw!r}; e.g. zip: [{{env.slip: [0, 0.1], train.steps: [40, 60]}}]")
        return []
    groups = []
    for i, group in enumerate(raw):
        if not isinstance(group, dict) or not group:
            err.add(("zip", i), f"expected a mapping dotted.key -> [values], got {group!r}")
            continue
        group = _flat(group)
        bad = [k for k, v in group.items() if not isinstance(v, list) or not v]
        for k in bad:
            err.add(("zip", i, k), f"expected a non-empty list of values, got {group[k]!r}")
        lengths = {k: len(v) for k, v in group.items() if k not in bad}
        if len(set(lengths.values())) > 1:
            err.add(("zip", i), f"lists must have equal length to be zipped, got {lengths}; pad or split the group")
        elif not bad:
            groups.append(group)
    return groups


def _parse_space(raw: dict, err: SpecErrors) -> dict[str, tuple[str, list]]:
    space = {}
    for key, dist in (raw or {}).items():
        path = ("search", "space", key)
        if not (isinstance(dist, dict) and len(dist) == 1 and next(iter(dist)) in DISTRIBUTIONS):
            err.add(path, f"expected one of {{uniform|loguniform|randint: [low, high]}} or {{choice: [...]}}, got {dist!r}")
            continue
        kind, args = next(iter(dist.items()))
        want = DISTRIBUTIONS[kind]
        if not isinstance(args, list) or not args or (want and len(args) != want):
            err.add(path + (kind,), f"expected {'[low, high]' if want else 'a non-empty list'}, got {args!r}")
        elif want and not (all(isinstance(a, (int, float)) and not isinstance(a, bool) for a in args) and args[0] < args[1]):
            err.add(path + (kind,), f"expected numbers low < high, got {args!r}")
        elif kind == "loguniform" and args[0] <= 0:
            err.add(path + (kind,), f"loguniform needs low > 0, got {args[0]!r}; e.g. [1e-4, 1e-1]")
        else:
            space[str(key)] = (kind, args)
    return space


# ----------------------------------------------------------------------------- loading

def read_spec(path: str | Path) -> SweepSpec:
    """The validated spec alone (no trial configs are built); raises SpecError."""
    spec, err = parse_spec(Path(path))
    if err.items:
        raise SpecError(err.items)
    return spec


def parse_spec(path: Path) -> tuple[SweepSpec, SpecErrors]:
    """The spec as far as it parses, and every problem found in it."""
    if not path.is_file():
        raise SpecError([f"sweep spec not found: {path}"])
    try:  # before anything walks the document: an alias bomb must not be expanded
        data, text = read_yaml_file(path, what="sweep spec")
    except YamlInputError as e:
        raise SpecError([str(e)]) from None
    err = SpecErrors(str(path), text)
    if not isinstance(data, dict):
        raise SpecError([f"{path}: top level must be a mapping (name, base, axes, arms, seeds, ...)"])
    raw = {k: data.pop(k) for k in _FREEFORM + ("space",) if k in data}
    if isinstance(data.get("search"), dict) and "space" in data["search"]:
        raw["space"] = data["search"].pop("space")
    errors: list[str] = []
    spec = build_section(SweepSpec, data, "", errors)
    for msg in errors:
        err.items.append(f"{err.file}:{err.line(_msg_path(msg)) or '?'}: {msg}")
    if errors:  # keep checking the rest: rebuild without the sections that failed
        bad = {_msg_path(m)[0] for m in errors if _msg_path(m)}
        spec = build_section(SweepSpec, {k: v for k, v in data.items() if k not in bad}, "", [])
        if not isinstance(spec, SweepSpec):
            spec = SweepSpec()
    # Absolute now: Ray workers, whose working directory is not ours (Tune moves each into a folder of
    # its own), resolve `base` and the trial's output folder under `storage`; a relative storage
    # there put a resumed trial's checkpoints in Ray's folder, so it trained again from step 0.
    spec.path, spec.text = Path(path).resolve(), text
    spec.storage = str(Path(spec.storage).resolve())
    if not isinstance(data.get("name", ""), str) or not _NAME.match(spec.name or ""):
        err.add(("name",), f"{spec.name!r} is not a usable sweep name; use letters, digits, '_', '.', '-', "
                           "e.g. name: kl_vs_filter")
    if not spec.base:
        err.add(("base",), "missing; name the training config the trials start from, e.g. "
                           "base: ../sweeps/base/frozenlake_tiny.yaml")
    elif not spec.base_path.is_file():
        err.add(("base",), f"{spec.base!r} not found (looked for {spec.base_path}); the path is relative to the spec file")
    fixed = raw.get("fixed", {})
    if not isinstance(fixed, dict):
        err.add(("fixed",), f"expected a mapping of overrides, got {fixed!r}")
        fixed = {}
    spec.fixed = _flat(fixed)
    spec.axes = _parse_axes(raw.get("axes", {}), err)
    spec.zip = _parse_zip(raw.get("zip", []), err)
    spec.arms = _parse_arms(raw.get("arms", {}), err)
    spec.seeds = _parse_seeds(raw.get("seeds", 1), err)
    spec.search.space = _parse_space(raw.get("space", {}), err)
    _check_structure(spec, err)
    return spec, err


def _msg_path(msg: str) -> tuple:
    """The spec path a schema message is about: `search.kind: ...` or `unknown key 'x.y' ...`."""
    m = re.match(r"unknown key '([^']+)'", msg) or re.match(r"([A-Za-z_][\w.\[\]]*)", msg)
    return tuple(m.group(1).replace("[", ".").replace("]", "").split(".")) if m else ()


def key_sources(spec: SweepSpec) -> dict[str, tuple]:
    """Every dotted config key the spec sets -> its YAML location (the last one that sets it)."""
    out = {k: ("fixed", k) for k in spec.fixed}
    for name, arm in spec.arms.items():
        out.update({k: ("arms", name, k) for k in arm})
    out.update({k: ("axes", k) for k in spec.axes})
    for i, group in enumerate(spec.zip):
        out.update({k: ("zip", i, k) for k in group})
    out.update({k: ("search", "space", k) for k in spec.search.space})
    return out


def _check_structure(spec: SweepSpec, err: SpecErrors) -> None:
    """Keys exist in the training schema and each varied key has exactly one source."""
    _check_keys(key_sources(spec), err)
    varied = [("axes", k) for k in spec.axes] + [("zip", k) for g in spec.zip for k in g] \
        + [("search.space", k) for k in spec.search.space]
    seen: dict[str, str] = {}
    for where, k in varied:
        if k in seen:
            err.add((where.split(".")[0], k), f"also varied in {seen[k]}; vary each key in one place")
        seen[k] = where
        for other, src in [(spec.fixed, "fixed")] + [(a, f"arms.{n}") for n, a in spec.arms.items()]:
            if k in other:
                err.add((where.split(".")[0], k), f"also set in {src}; a varied key cannot be fixed too")
    for k in spec.fixed:
        if k in ("train.seed", "train.output_dir", "train.resume"):
            err.add(("fixed", k), "is set by the sweep for each trial; remove it (seeds go in `seeds:`)")
    if spec.search.kind == "grid" and spec.search.space:
        err.add(("search", "space"), "only used by search kind random or optuna; move the keys to `axes` for a grid")
    if spec.search.kind != "grid" and not spec.search.space:
        err.add(("search", "space"), f"search kind {spec.search.kind} needs a space, e.g. "
                                     "space: {algo.kl_coef: {loguniform: [1e-4, 1e-1]}}")
    if spec.search.kind == "optuna" and (spec.axes or spec.zip or len(spec.arms) > 1 or len(spec.seeds) > 1):
        err.add(("search", "kind"), "optuna proposes one config per trial: use a single arm and seed and no "
                                    "axes/zip; put the tuned keys in search.space")
