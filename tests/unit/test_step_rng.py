"""The run's random streams: one per purpose, reproducible, and never shared between purposes."""
import numpy as np

from ragen2_core.train.state import (FILTER_STREAM, LEARNER_STREAM, MI_PROBE_STREAM, ROLLOUT_STREAM,
                                     learner_stream, step_rng)


def test_same_key_same_draws_and_a_resumed_step_replays():
    a = step_rng(3, 17, MI_PROBE_STREAM).integers(0, 2**31, 8)
    b = step_rng(3, 17, MI_PROBE_STREAM).integers(0, 2**31, 8)
    assert (a == b).all()
    assert not (a == step_rng(3, 18, MI_PROBE_STREAM).integers(0, 2**31, 8)).all()
    assert not (a == step_rng(3, 17, MI_PROBE_STREAM, rank=1).integers(0, 2**31, 8)).all()


def test_first_epoch_keeps_stream_1_so_archived_runs_replay():
    assert learner_stream(0) == LEARNER_STREAM == 1


def test_no_learner_epoch_shares_a_stream_with_another_purpose():
    # Before the streams were named, epoch e drew from 1 + e: epoch 1 met the MI probe (stream 2), so
    # its minibatch order and the probe's prompt choice were the same draws.
    others = {ROLLOUT_STREAM, MI_PROBE_STREAM, FILTER_STREAM}
    epochs = [learner_stream(e) for e in range(64)]
    assert len(set(epochs)) == 64
    assert not others & set(epochs)
    B = 32
    probe = step_rng(0, 5, MI_PROBE_STREAM).permutation(B)
    order = step_rng(0, 5, learner_stream(1)).permutation(B)
    assert not np.array_equal(probe, order)
