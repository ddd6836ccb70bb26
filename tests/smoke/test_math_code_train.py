"""Training end to end on the single-turn envs with a very small policy: the trainer, rollout engine
and warm start run unchanged on math and on code (whose replies go through the sandbox). The warm
start is long enough that some replies are well-formed, so rewards really are computed."""
import pytest

from ragen2_core.config import load_config
from ragen2_core.tracking import MemorySink
from ragen2_core.train.trainer import run
from tiny import TINY


def tiny_run(env: str, tmp_path, cache):
    cfg = load_config(f"sweeps/base/{env}_tiny.yaml", TINY + [
        f"warmstart.envs=[{env}]", "warmstart.steps=300", "warmstart.episodes=256",
        "policy.hidden_size=64", "policy.intermediate_size=128", "rollout.max_new_tokens=32",
        "train.steps=2", "train.eval_every=2", "train.threads=1", "collapse.every=1",
        f"policy.cache_dir={cache}", f"train.output_dir={tmp_path}"])
    sink = MemorySink()
    result = run(cfg, sink)
    return result, sink


@pytest.mark.parametrize("env", ["math", "code"])
def test_tiny_training_run(env, tmp_path, tmp_path_factory, request):
    if env == "code":
        request.getfixturevalue("sandbox")  # fails loudly where programs cannot be sandboxed
    result, sink = tiny_run(env, tmp_path, tmp_path_factory.mktemp("cache"))
    assert result["steps_done"] == 2 and result["stop_reason"] == "completed"
    assert [s for s, _ in sink.metrics] == [1, 2]
    assert all(m["rollout/turns"] == 1.0 for _, m in sink.metrics)
    assert any(m["rollout/format_valid"] > 0 for _, m in sink.metrics)  # replies were graded, not only penalised
    assert "eval/success" in result and "collapse/mi" in sink.metrics[0][1]
