"""Where training output goes: the `MetricSink` protocol and its backends.

    from ragen2_core.tracking import FanoutSink, MlflowSink, StdoutSink, git_sha, run_tags

    sink = FanoutSink(StdoutSink(total_steps=cfg.train.steps),
                      MlflowSink(experiment=cfg.tracking.experiment,
                                 tags=run_tags(config_hash(cfg), cfg.train.seed, git_sha())))
    with sink:                       # closes FINISHED, or FAILED / KILLED on an exception
        sink.log_params(flatten(cfg))
        sink.log_metrics({"rollout/success": 0.4}, step=1)

`MlflowSink` is loaded on first use, so importing this package does not import mlflow.
"""
from __future__ import annotations

from .sinks import (STATUSES, FanoutSink, JsonlSink, MemorySink, MetricSink, SinkContext, StdoutSink,
                    check_status, git_sha, run_tags)

__all__ = ["MetricSink", "SinkContext", "MemorySink", "StdoutSink", "JsonlSink", "FanoutSink", "MlflowSink",
           "run_tags", "git_sha", "check_status", "STATUSES"]


def __getattr__(name):
    if name == "MlflowSink":
        from .mlflow_sink import MlflowSink
        return MlflowSink
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
