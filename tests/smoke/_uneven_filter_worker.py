"""Two-rank training run in which rank 1's filter keeps nothing while rank 0's keeps everything,
used by tests/smoke/test_train_torchrun.py.

    OMP_NUM_THREADS=1 torchrun --nproc_per_node 2 tests/smoke/_uneven_filter_worker.py OUT_DIR CACHE

The filter is replaced (in this process only) by one that depends on the rank: the trainer must let
the empty rank join the gradient all-reduce at zero weight instead of skipping it, or the other
rank waits forever. Each rank writes OUT_DIR/rank{r}.json with its kept groups per step and a
digest of its final parameters (data parallelism keeps the ranks' parameters identical).
"""
import json
import sys
from pathlib import Path

import torch

import ragen2_core.train.trainer as trainer
from ragen2_core.tracking import MemorySink

sys.path.insert(0, str(Path(__file__).parent))
from tiny import cfg_for  # noqa: E402


def digest(model) -> float:
    return float(sum(p.detach().double().sum() for p in model.parameters()))


def main(out_dir: str, cache: str) -> None:
    def by_rank(group_rewards, **_):
        keep = torch.distributed.get_rank() == 0
        return torch.full((group_rewards.shape[0],), keep, dtype=torch.bool)

    seen = {}
    setup, export = trainer.setup, trainer.export

    def setup_and_note(cfg, sink):
        r = setup(cfg, sink)
        seen["start"] = digest(r.actor.module)
        return r

    def note_and_export(r, *args, **kwargs):
        seen["end"] = digest(r.actor.module)
        return export(r, *args, **kwargs)

    trainer.select_groups, trainer.setup, trainer.export = by_rank, setup_and_note, note_and_export
    sink = MemorySink()
    result = trainer.run(cfg_for(Path(out_dir) / "run", cache, "train.steps=2", "collapse.every=0",
                                 "train.eval_every=0"), sink)
    rank = torch.distributed.get_rank()
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps({
        "kept": [m["filter/kept_groups"] for _, m in sink.metrics], "stop_reason": result["stop_reason"],
        "steps_done": result["steps_done"], **seen}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
