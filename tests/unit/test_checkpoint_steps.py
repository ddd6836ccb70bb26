"""How many steps a trial's newest checkpoint holds (the sweep's time-left estimate reads it)."""
from ragen2_core.train.checkpoint import steps_done


def test_steps_done_reads_the_newest_checkpoint_folder(tmp_path):
    assert steps_done(tmp_path) == 0                         # no checkpoints folder at all
    for name in ("step_000019", "step_000039", ".tmp-step_000059"):
        (tmp_path / "checkpoints" / name).mkdir(parents=True)
    assert steps_done(tmp_path) == 40                        # step indices count from 0; a temp folder is no checkpoint
