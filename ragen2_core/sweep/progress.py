"""Live sweep progress on stdout, as a Tune callback (Tune's own reporter is silenced).

    [sweep] 3/12 done, 2 running, 0 failed, 7 pending | best eval/success 0.42 (filter-1a2b3c4d) | 4m10s, about 11m left
      trial               step   eval/success  collapse/mi  filter/kept_ratio
      nofilter-9f8e7d6c   12/40  0.31          0.52         1
      filter-1a2b3c4d     10/40  0.42          0.61         0.75

A line when a trial starts, ends or fails; the table every `every_s` seconds while trials run.
The time left lays the steps still to run (each unfinished trial's length less what its checkpoint
or its results here hold) over as many trials side by side as have run, at the rate this process
has run steps since its first result. It comes out high where a stopper ends trials early.
"""
from __future__ import annotations

import heapq
import math
import sys
import time
from typing import Callable

from ray.tune import Callback

from ragen2_core.sweep.spec import SweepSpec
from ragen2_core.sweep.trials import Trial
from ragen2_core.sweep.trainable import resolve

COLUMNS = ("eval/success", "collapse/mi", "filter/kept_ratio")


def _fmt(v) -> str:
    return "-" if v is None else ("nan" if isinstance(v, float) and math.isnan(v) else f"{v:.3g}")


def _span(seconds: float) -> str:
    hours, minutes = divmod(math.ceil(seconds / 60), 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m"


class Progress(Callback):
    def __init__(self, spec: SweepSpec, trials: dict[str, Trial], total: int, steps: dict[str, int],
                 finished: frozenset[str] = frozenset(), every_s: float = 30.0, stream=None,
                 checkpointed: dict[str, int] | None = None, clock: Callable[[], float] = time.monotonic):
        self.spec, self.trials, self.total, self.steps = spec, trials, total, steps
        self.every_s, self.stream = every_s, stream
        self.latest: dict[str, dict] = {}      # our trial id -> latest value of each shown key
        self.counts: dict[str, int] = {}       # Tune status -> trials (restored finished ones included)
        self.running: list[str] = []           # our ids of the running trials
        self.terminated: set[str] = set()      # our ids of the trials Tune has finished
        self.errored: set[str] = set()         # our ids of the trials that failed
        # Finished before this run, as MLflow knows them: a resume that began without Tune's state
        # holds only the trials left then, so Tune's own count misses the ones finished before it.
        self.finished = frozenset(finished)
        self.best: tuple[float, str] | None = None
        self.clock = clock
        self.t0 = self.last_print = clock()
        self.highest: dict[str, int] = {}      # our trial id -> highest step it reported in this process
        self.checkpointed = checkpointed or {}  # our trial id -> steps its checkpoint held when this began
        self.stepped = 0                       # steps run here that were not a replay of one run before
        self.first_result_at: float | None = None
        self.slots = 1                         # the most trials seen running side by side

    def _say(self, line: str) -> None:
        out = self.stream or sys.stdout
        out.write(line + "\n")
        out.flush()

    def _id(self, trial) -> str:
        return resolve(self.spec, self.trials, trial.config).trial_id

    def _count(self, trials, ended=None, as_status: str = "") -> None:
        # Tune may call the end hooks before it updates the trial's own status.
        status = [as_status if t is ended else t.status for t in trials]
        self.counts = {}
        for s in status:
            self.counts[s] = self.counts.get(s, 0) + 1
        self.running = [self._id(t) for t, s in zip(trials, status) if s == "RUNNING"]
        self.terminated = {self._id(t) for t, s in zip(trials, status) if s == "TERMINATED"}
        self.errored = {self._id(t) for t, s in zip(trials, status) if s == "ERROR"}
        self.slots = max(self.slots, len(self.running))

    def on_trial_start(self, iteration, trials, trial, **info):
        tid = self._id(trial)
        self._count(trials)
        self._say(f"[sweep] start {tid} ({resolve(self.spec, self.trials, trial.config).label})")

    def on_trial_result(self, iteration, trials, trial, result, **info):
        tid = self._id(trial)
        row = self.latest.setdefault(tid, {})
        row.update({k: result[k] for k in COLUMNS + (self.spec.metric, "step") if k in result})
        self._count_step(tid, result.get("step"))
        value = result.get(self.spec.metric)
        if isinstance(value, (int, float)) and not math.isnan(value):
            better = self.best is None or (value > self.best[0] if self.spec.mode == "max" else value < self.best[0])
            if better:
                self.best = (float(value), tid)

    def _count_step(self, tid: str, step) -> None:
        if not isinstance(step, (int, float)) or isinstance(step, bool):
            return
        step = int(step)
        if self.first_result_at is None:
            self.first_result_at = self.clock()
        # A trial's first result here is one step (fresh, or the one after its checkpoint); a trial
        # Tune restarts replays steps it has run, which bring the sweep no closer to its end.
        before = self.highest.get(tid)
        self.stepped += 1 if before is None else max(0, step - before)
        self.highest[tid] = step if before is None else max(before, step)

    def time_left(self, pending: int) -> float | None:
        """Seconds until the last trial ends, None in the first minute of results: the trials left
        are laid out over as many slots as have run side by side, each slot running one trial's
        steps at the rate the sweep has run them so far, divided among its slots."""
        if self.first_result_at is None or self.stepped == 0:
            return None
        elapsed = self.clock() - self.first_result_at
        if elapsed < 60:
            return None
        per_step = elapsed * self.slots / self.stepped          # seconds one trial takes for a step
        per_trial = sum(self.steps.values()) / len(self.steps) if self.steps else 0

        def rest(tid: str) -> float:
            return max(0, self.steps.get(tid, per_trial) - max(self.highest.get(tid, 0), self.checkpointed.get(tid, 0)))

        if self.spec.search.kind != "optuna":   # a grid: every trial known, pending ones included
            ended = self.terminated | self.finished | self.errored | set(self.running)
            queued = [rest(t) for t in self.steps if t not in ended]
        else:                                   # a search: trials not yet sampled have no id
            queued = [per_trial] * pending
        ends = [rest(t) * per_step for t in self.running] + [0.0] * (self.slots - len(self.running))
        heapq.heapify(ends)
        for steps in queued:                    # each next trial takes the slot that frees first
            heapq.heappush(ends, heapq.heappop(ends) + steps * per_step)
        return max(ends)

    def _end(self, trials, trial, status: str) -> None:
        tid = self._id(trial)
        self._count(trials, trial, "TERMINATED" if status == "done" else "ERROR")
        row = self.latest.get(tid, {})
        self._say(f"[sweep] {status} {tid} at step {row.get('step', 0)}: {self.spec.metric} "
                  f"{_fmt(row.get(self.spec.metric))} | {self.headline()}")

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._end(trials, trial, "done")

    def on_trial_error(self, iteration, trials, trial, **info):
        self._end(trials, trial, "failed")

    def headline(self) -> str:
        done = len(self.terminated | self.finished)
        running, failed = self.counts.get("RUNNING", 0), self.counts.get("ERROR", 0)
        pending = max(0, self.total - done - running - failed)
        best = f"{self.spec.metric} {self.best[0]:.3g} ({self.best[1]})" if self.best else f"{self.spec.metric} -"
        minutes, seconds = divmod(int(self.clock() - self.t0), 60)
        left = self.time_left(pending)
        left = f", about {_span(left)} left" if left is not None else ""
        return (f"{done}/{self.total} done, {running} running, {failed} failed, "
                f"{pending} pending | best {best} | {minutes}m{seconds:02d}s{left}")

    def on_step_end(self, iteration, trials, **info):
        if self.clock() - self.last_print < self.every_s:
            return
        self.last_print = self.clock()
        self._count(trials)
        running = self.running
        lines = [f"[sweep] {self.headline()}"]
        if running:
            width = max(len(t) for t in running)
            lines.append(f"  {'trial':<{width}}  {'step':>7}  " + "  ".join(f"{c:<17}" for c in COLUMNS))
            for tid in running:
                row = self.latest.get(tid, {})
                step = f"{row.get('step', 0)}/{self.steps.get(tid, '?')}"
                lines.append(f"  {tid:<{width}}  {step:>7}  " + "  ".join(f"{_fmt(row.get(c)):<17}" for c in COLUMNS))
        self._say("\n".join(lines))
