"""Where training output goes: the `MetricSink` protocol and its backends.

    from ragen2_core.tracking import make_sink, run_tags, git_sha

    sink = make_sink(["mlflow", "stdout"], tracking=cfg.tracking, total_steps=cfg.train.steps,
                     tags=run_tags(config_hash(cfg), cfg.train.seed, git_sha()))
    with sink:                       # closes FINISHED, or FAILED / KILLED on an exception
        sink.log_params(flatten(cfg))
        sink.log_metrics({"rollout/success": 0.4}, step=1)

`MlflowSink` is loaded on first use, so importing this package does not import mlflow.
"""
from __future__ import annotations

from pathlib import Path
from typing import IO, Optional, Sequence

from .sinks import (STATUSES, FanoutSink, JsonlSink, MemorySink, MetricSink, SinkContext, StdoutSink,
                    check_status, git_sha, run_tags)

SINK_KINDS = ("mlflow", "stdout", "jsonl", "memory")

__all__ = ["MetricSink", "SinkContext", "MemorySink", "StdoutSink", "JsonlSink", "FanoutSink", "MlflowSink",
           "make_sink", "run_tags", "git_sha", "check_status", "STATUSES", "SINK_KINDS"]


def __getattr__(name):
    if name == "MlflowSink":
        from .mlflow_sink import MlflowSink
        return MlflowSink
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def make_sink(kinds: Sequence[str] = ("mlflow", "stdout"), *, tracking=None, run_id: Optional[str] = None,
              parent_run_id: Optional[str] = None, tags: Optional[dict[str, str]] = None,
              jsonl_path: Optional[str | Path] = None, total_steps: Optional[int] = None,
              stream: Optional[IO[str]] = None) -> MetricSink:
    """One sink, or a FanoutSink over several, built from kind names.

    `tracking` is a TrackingConfig (uri, experiment, run_name); None means its defaults.
    "jsonl" needs `jsonl_path`. `tags` go to every sink that was asked for.
    """
    if isinstance(kinds, str):
        kinds = [kinds]
    unknown = [k for k in kinds if k not in SINK_KINDS]
    if unknown or not kinds:
        raise ValueError(f"sink kinds {list(kinds)!r} invalid; use one or more of {'|'.join(SINK_KINDS)}")
    sinks: list[MetricSink] = []
    for kind in kinds:
        if kind == "mlflow":
            from .mlflow_sink import MlflowSink
            sinks.append(MlflowSink(tracking_uri=getattr(tracking, "uri", None),
                                    experiment=getattr(tracking, "experiment", None) or "ragen2",
                                    run_name=getattr(tracking, "run_name", None),
                                    run_id=run_id, parent_run_id=parent_run_id, tags=tags))
            continue
        if kind == "stdout":
            sink = StdoutSink(total_steps=total_steps, stream=stream)
        elif kind == "jsonl":
            if jsonl_path is None:
                raise ValueError("sink kind 'jsonl' needs jsonl_path, e.g. runs/<name>/metrics.jsonl")
            sink = JsonlSink(jsonl_path)
        else:
            sink = MemorySink()
        if tags:
            sink.set_tags(tags)
        sinks.append(sink)
    return sinks[0] if len(sinks) == 1 else FanoutSink(*sinks)
