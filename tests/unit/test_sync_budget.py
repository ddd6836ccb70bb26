"""Host-device synchronisation budget of the rollout's decode loop and of the update's micro-batches.

On a GPU every read of a device value by the host stalls the next launch; on a CPU it costs nothing,
so these budgets are counted (ragen2_core/rollout/syncs.py), not timed: a decode step reads nothing
except, every `stop_every` steps, whether every row has stopped, plus one read of the turn's tokens;
a micro-batch of the update reads nothing. A change that puts a read back fails here.
"""
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from ragen2_core.envs.registry import make_env
from ragen2_core.rollout.episodes import rollout
from ragen2_core.rollout.sampler import KVSession, SamplingParams
from ragen2_core.rollout.syncs import count_syncs

sys.path.insert(0, str(Path(__file__).parents[1] / "smoke"))
from tiny import cfg_for  # noqa: E402

ROWS = 6
NEVER = torch.tensor([-1])  # a stop id no row samples: every row decodes its whole budget


def decode_syncs(policy, steps: int, every: int, **sampling) -> int:
    model, tok = policy
    session = KVSession(model, tok.pad_token_id)
    session.stop_every = every
    with torch.no_grad():
        logits = session.append([[5, 6, 7, 8, 9], [10, 11]] * (ROWS // 2))
        with count_syncs() as c:
            session.decode(logits, SamplingParams(max_new_tokens=steps, **sampling), NEVER,
                           torch.Generator().manual_seed(0))
    return c.syncs


@pytest.mark.parametrize("sampling", [dict(temperature=0.7, top_p=0.9, top_k=20), dict(greedy=True)])
@pytest.mark.parametrize("every", [1, 4])
def test_decode_reads_only_the_stop_checks_and_the_turn(policy, every, sampling):
    steps = 13
    checks = (steps - 1) // every  # after steps every, 2 every, ...; the last step ends the turn unasked
    assert decode_syncs(policy, steps, every, **sampling) == checks + 1  # + the one read of the tokens


def test_a_decode_step_reads_nothing(policy):
    # 8 more steps with a check every 8: exactly one more read, whatever the model does inside
    assert decode_syncs(policy, 25, 8) - decode_syncs(policy, 17, 8) == 1


def play(policy, seeds, every, generator, **kw):
    model, tok = policy
    session = KVSession(model, tok.pad_token_id, stop_every=every)
    return rollout(model, tok, lambda: make_env("frozenlake", slip=0.1, max_turns=3), env_seeds=seeds,
                   dynamics_seeds=list(range(len(seeds))), group_ids=seeds, generator=generator, session=session,
                   sampling=SamplingParams(**{"max_new_tokens": 14, **kw}))


@pytest.mark.parametrize("sampling", [dict(temperature=1.0), dict(temperature=0.8, top_p=0.9), dict(greedy=True)])
def test_stop_check_cadence_changes_no_token_and_no_draw(policy, sampling):
    # Steps run past the last row's stop are undone: the replies, the later turns (the cache) and
    # the generator's next draw are those of a check at every step.
    seeds = [1, 2, 2, 3, 4, 4]
    runs = []
    for every in (1, 3, 8):
        g = torch.Generator().manual_seed(0)
        batch = play(policy, seeds, every, g, **sampling)
        runs.append((batch.token_ids, batch.n_turns, torch.rand(4, generator=g).tolist()))
    assert runs[1] == runs[0] and runs[2] == runs[0]


def update_syncs(cache, grad_accum: int) -> int:
    """Reads from the device inside the update of a one-step tiny run."""
    import ragen2_core.train.trainer as trainer
    from ragen2_core.tracking import MemorySink

    counts, original = [], trainer.update

    def counted(*args, **kwargs):
        with count_syncs() as c:
            out = original(*args, **kwargs)
        counts.append(c.syncs)
        return out

    trainer.update = counted
    try:
        with tempfile.TemporaryDirectory() as out:
            trainer.run(cfg_for(out, cache, "train.steps=1", "train.eval_every=0", "collapse.every=0",
                                "rollout.n_groups=4", f"train.grad_accum={grad_accum}"), MemorySink())
    finally:
        trainer.update = original
    return counts[0]


def test_update_micro_batches_read_nothing(tmp_path_factory):
    # The same step cut into 2 or 4 micro-batches (one optimizer step either way): a read per
    # micro-batch would show as a difference. What remains is per step (the optimizer's own).
    cache = tmp_path_factory.mktemp("policy-cache")
    assert update_syncs(cache, 4) == update_syncs(cache, 2)
