"""Metric sinks: where the trainer sends params, per-step metrics, tags and artifacts.

The trainer only sees the `MetricSink` protocol; which backends receive the data is decided
by whoever builds the sink (CLI, Tune trainable, tests).

    from ragen2_core.tracking import FanoutSink, JsonlSink, MemorySink, StdoutSink

    with FanoutSink(StdoutSink(total_steps=100), JsonlSink("runs/demo/metrics.jsonl")) as sink:
        sink.log_params({"algo.kl_coef": 0.0})
        sink.log_metrics({"rollout/success": 0.41, "actor/entropy": 1.23}, step=12)
    # leaving the block closes every sink: FINISHED, or FAILED / KILLED on an exception

    mem = MemorySink(); mem.log_metrics({"a/b": 1.0}, step=3); mem.history("a/b")  # -> [(3, 1.0)]

Also here: `run_tags` and `git_sha`, the reproducibility tags every run carries.
"""
from __future__ import annotations

import gzip
import importlib.metadata
import json
import math
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Optional, Protocol, runtime_checkable

STATUSES = ("FINISHED", "FAILED", "KILLED")


def check_status(status: str) -> str:
    if status not in STATUSES:
        raise ValueError(f"close status {status!r} is not one of {'|'.join(STATUSES)}")
    return status


@runtime_checkable
class MetricSink(Protocol):
    def log_params(self, params: dict[str, object]) -> None: ...
    def log_metrics(self, metrics: dict[str, float], step: int) -> None: ...
    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None: ...
    def log_text(self, text: str, artifact_file: str) -> None: ...
    def set_tags(self, tags: dict[str, str]) -> None: ...
    def close(self, status: str = "FINISHED") -> None: ...


class SinkContext:
    """`with sink:` closes it with a status that says how the block ended."""

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            self.close("FINISHED")
        else:
            self.close("KILLED" if issubclass(exc_type, KeyboardInterrupt) else "FAILED")
        return False


# ----------------------------------------------------------------------------- memory

class MemorySink(SinkContext):
    """Keeps everything in Python containers; for tests and for forwarding to Ray Tune."""

    def __init__(self):
        self.params: dict[str, object] = {}
        self.metrics: list[tuple[int, dict[str, float]]] = []
        self.tags: dict[str, str] = {}
        self.artifacts: list[tuple[str, Optional[str]]] = []
        self.texts: dict[str, str] = {}
        self.closed_status: Optional[str] = None

    def log_params(self, params):
        self.params.update(params)

    def log_metrics(self, metrics, step):
        self.metrics.append((int(step), dict(metrics)))  # copy: callers often reuse one dict

    def log_artifact(self, path, artifact_path=None):
        self.artifacts.append((str(path), artifact_path))

    def log_text(self, text, artifact_file):
        self.texts[artifact_file] = text

    def set_tags(self, tags):
        self.tags.update(tags)

    def close(self, status="FINISHED"):
        self.closed_status = check_status(status)

    def history(self, key: str) -> list[tuple[int, float]]:
        return [(step, m[key]) for step, m in self.metrics if key in m]

    def latest(self) -> dict[str, float]:
        """Most recent value of every key, across calls."""
        out: dict[str, float] = {}
        for _, m in self.metrics:
            out.update(m)
        return out


# ----------------------------------------------------------------------------- stdout

_LABELS = {"rollout/success": "success", "rollout/reward_mean": "reward", "eval/success": "eval"}
_STEP_TIME = "time/step_s"


def _fmt(value) -> str:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return str(value)
    return "nan" if math.isnan(v) else f"{v:.3g}"


def _duration(seconds: float) -> str:
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class StdoutSink(SinkContext):
    """One compact progress line per logged step, e.g.

        step  12/100 [#---------] success 0.41 reward 0.38 entropy 1.23 kl 0.0012 | 1.9 s/step, eta 2m47s

    Only keys present in the call are shown. Seconds per step come from `time/step_s` when
    logged, else from the wall clock between steps; the ETA needs `total_steps`.
    """

    def __init__(self, keys=("rollout/success", "rollout/reward_mean", "actor/entropy", "actor/kl",
                             "eval/success", _STEP_TIME), total_steps: Optional[int] = None, every: int = 1,
                 stream: Optional[IO[str]] = None):
        self.keys = tuple(keys)
        self.total_steps = total_steps
        self.every = max(1, int(every))
        self.stream = stream  # resolved at write time so pytest's capsys sees the output
        self._last: Optional[tuple[int, float]] = None  # (step, wall time) of the previous step

    def _write(self, line: str) -> None:
        out = self.stream or sys.stdout
        out.write(line + "\n")
        out.flush()

    def _seconds_per_step(self, metrics, step: int) -> Optional[float]:
        now = time.monotonic()
        measured = None
        if self._last is not None and step > self._last[0]:
            measured = (now - self._last[1]) / (step - self._last[0])
        if self._last is None or step > self._last[0]:
            self._last = (step, now)  # an eval logged separately at the same step is not a new step
        if _STEP_TIME in self.keys and _STEP_TIME in metrics:
            try:
                return float(metrics[_STEP_TIME])
            except (TypeError, ValueError):
                return None
        return measured

    def log_metrics(self, metrics, step):
        step = int(step)
        per_step = self._seconds_per_step(metrics, step)
        if step % self.every and step != self.total_steps:
            return
        total = self.total_steps
        parts = [f"step {step:>{len(str(total))}}/{total}" if total else f"step {step}"]
        if total:
            filled = min(10, max(0, round(10 * step / total)))
            parts.append("[" + "#" * filled + "-" * (10 - filled) + "]")
        for key in self.keys:
            if key != _STEP_TIME and key in metrics:
                parts.append(f"{_LABELS.get(key, key.rsplit('/', 1)[-1])} {_fmt(metrics[key])}")
        line = " ".join(parts)
        if per_step is not None and math.isfinite(per_step):
            line += f" | {per_step:.2g} s/step"
            if total:
                line += f", eta {_duration(per_step * max(0, total - step))}"
        self._write(line)

    def log_params(self, params):
        pass

    def log_artifact(self, path, artifact_path=None):
        pass

    def log_text(self, text, artifact_file):
        pass

    def set_tags(self, tags):
        pass

    def close(self, status="FINISHED"):
        if check_status(status) != "FINISHED":
            self._write(f"run ended: {status}")


# ----------------------------------------------------------------------------- jsonl

_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _jsonable(value):
    """JSON-safe copy: non-finite floats become the strings "NaN" / "Infinity" / "-Infinity".

    Strict JSON has no NaN; strings (rather than null) keep NaN and inf apart, and
    `float("NaN")` / `float("-Infinity")` read them back.
    """
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        return value if math.isfinite(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    try:
        return _jsonable(float(value))  # numpy / torch scalars
    except (TypeError, ValueError):
        return str(value)


class JsonlSink(SinkContext):
    """Appends one JSON object per call to `path`, flushed at once so a crash loses nothing.

    Records: {"type": "params"|"metrics"|"tags"|"artifact"|"text"|"close", "time": unix_s, ...};
    metrics records carry "step" and "metrics". Non-finite floats are written as the strings
    "NaN", "Infinity", "-Infinity" (see `_jsonable`); `JsonlSink.read` turns them back into
    floats. Reopening an existing file appends, so a resumed run continues the same log.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", encoding="utf-8")

    def _record(self, kind: str, **fields) -> None:
        line = json.dumps({"type": kind, "time": round(time.time(), 3), **_jsonable(fields)}, allow_nan=False)
        self._file.write(line + "\n")
        self._file.flush()

    def log_params(self, params):
        self._record("params", params=params)

    def log_metrics(self, metrics, step):
        self._record("metrics", step=int(step), metrics={k: float(v) for k, v in metrics.items()})

    def log_artifact(self, path, artifact_path=None):
        self._record("artifact", path=str(Path(path).resolve()), artifact_path=artifact_path)

    def log_text(self, text, artifact_file):
        self._record("text", artifact_file=artifact_file, text=text)

    def set_tags(self, tags):
        self._record("tags", tags=tags)

    def close(self, status="FINISHED"):
        if self._file.closed:
            return
        self._record("close", status=check_status(status))
        self._file.close()

    @staticmethod
    def read(path: str | Path) -> list[dict]:
        """All records, with metric values decoded back to floats (NaN and inf included); a path
        ending in .gz is read through gzip (a log kept beside the docs)."""
        path = Path(path)
        data = path.read_bytes()
        text = (gzip.decompress(data) if path.suffix == ".gz" else data).decode("utf-8")
        records = []
        for line in text.splitlines():
            if not line.strip():
                continue
            rec = json.loads(line)
            if rec.get("type") == "metrics":
                rec["metrics"] = {k: _NONFINITE.get(v, v) if isinstance(v, str) else v
                                  for k, v in rec["metrics"].items()}
            records.append(rec)
        return records


# ----------------------------------------------------------------------------- fan-out

class FanoutSink(SinkContext):
    """Forwards every call to each sink in order.

    Every sink gets every call even when an earlier one raises; the first error is re-raised
    afterwards. That matters most for `close`: a failing MLflow server must not leave the
    JSONL file open or the stdout sink silent.
    """

    def __init__(self, *sinks: MetricSink):
        self.sinks = list(sinks)

    def _each(self, method: str, *args) -> None:
        first: Optional[BaseException] = None
        for sink in self.sinks:
            try:
                getattr(sink, method)(*args)
            except Exception as e:
                first = first or e
        if first is not None:
            raise first

    def log_params(self, params):
        self._each("log_params", params)

    def log_metrics(self, metrics, step):
        self._each("log_metrics", metrics, step)

    def log_artifact(self, path, artifact_path=None):
        self._each("log_artifact", path, artifact_path)

    def log_text(self, text, artifact_file):
        self._each("log_text", text, artifact_file)

    def set_tags(self, tags):
        self._each("set_tags", tags)

    def close(self, status="FINISHED"):
        self._each("close", check_status(status))


# ----------------------------------------------------------------------------- run metadata

def _version(dist: str) -> str:
    # Package metadata, not an import: importing deepspeed just to read its version is slow
    # and can fail on machines without CUDA.
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "missing"


def git_sha(path: str | Path = ".") -> Optional[str]:
    """HEAD commit of the repository containing `path`, with "-dirty" if tracked files changed.

    Untracked files are ignored: run outputs (mlflow.db, runs/) land in the working tree
    and would otherwise mark every run after the first as dirty.
    """
    def git(*args) -> Optional[str]:
        try:
            done = subprocess.run(["git", *args], cwd=path, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    sha = git("rev-parse", "HEAD")
    if not sha:
        return None
    return sha + "-dirty" if git("status", "--porcelain", "--untracked-files=no") else sha


def run_tags(cfg_hash: str, seed: int, git_sha: Optional[str]) -> dict[str, str]:
    """Tags that let a run be matched to its code, settings and library versions."""
    return {
        "ragen2.config_hash": cfg_hash,
        "ragen2.seed": str(seed),
        "ragen2.git_sha": git_sha or "unknown",
        "ragen2.python": platform.python_version(),
        "ragen2.torch": _version("torch"),
        "ragen2.transformers": _version("transformers"),
        "ragen2.deepspeed": _version("deepspeed"),
    }
