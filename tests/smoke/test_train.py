"""The training loop end to end on a very small policy: determinism, resume, learning signal,
MLflow layout. Each run takes seconds; the policy is barely warm-started (this checks plumbing,
not learning)."""
import json
import math
import subprocess
import sys

import pytest
import torch
from mlflow.tracking import MlflowClient
from transformers import AutoModelForCausalLM

from ragen2_core.tracking import MemorySink
from ragen2_core.train.trainer import run
from tiny import TINY, cfg_for


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("policy-cache")


WALL_CLOCK = ("perf/tokens_per_s", "cost/wall_s_per_update", "cost/cum_wall_s")


def metrics_by_step(sink):
    return [(s, {k: v for k, v in m.items() if not k.startswith("time/") and k not in WALL_CLOCK})
            for s, m in sink.metrics]


def same(a, b):
    assert [s for s, _ in a] == [s for s, _ in b]
    for (_, x), (_, y) in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            assert x[k] == pytest.approx(y[k], rel=1e-6, abs=1e-9, nan_ok=True), k


@pytest.mark.parametrize("advantage", ["grpo", "gae"])
def test_same_seed_same_metrics_and_parameters_move(tmp_path, cache, advantage):
    sinks = []
    for name in ("a", "b"):
        sink = MemorySink()
        run(cfg_for(tmp_path / name, cache, "train.steps=2", f"algo.advantage={advantage}",
                    "algo.kl_coef=0.01"), sink)
        sinks.append(sink)
    same(metrics_by_step(sinks[0]), metrics_by_step(sinks[1]))
    keys = sinks[0].metrics[-1][1].keys()
    for k in ("rollout/success", "filter/kept_ratio", "actor/entropy", "actor/kl", "actor/pg_loss",
              "actor/grad_norm", "critic/value_loss", "eval/success", "time/rollout_s"):
        assert k in keys, k
    value_loss = sinks[0].history("critic/value_loss")[-1][1]
    assert math.isfinite(value_loss) == (advantage == "gae")  # NaN when there is no critic
    # the exported policy differs from the cached starting point
    start = AutoModelForCausalLM.from_pretrained(next(cache.glob("embedded-*")))
    trained = AutoModelForCausalLM.from_pretrained(tmp_path / "a" / "policy")
    assert any(not torch.equal(p, q) for p, q in zip(start.parameters(), trained.parameters()))


def test_resume_continues_the_same_history(tmp_path, cache):
    # MI every 2 steps: its EMA and the cost counters must carry over the restart too.
    diag = ["collapse.every=2", "stops.mi_alert_action=warn"]
    full = MemorySink()
    run(cfg_for(tmp_path / "full", cache, "train.steps=4", *diag), full)
    first = MemorySink()
    run(cfg_for(tmp_path / "cut", cache, "train.steps=2", "train.checkpoint_every=2", *diag), first)
    rest = MemorySink()
    run(cfg_for(tmp_path / "cut", cache, "train.steps=4", "train.checkpoint_every=2", "train.resume=true", *diag), rest)
    assert [s for s, _ in rest.metrics] == [3, 4]
    assert "collapse/mi_zscore_ema" in rest.metrics[0][1] and "collapse/mi_perm_zscore_ema" in rest.metrics[0][1]
    same(metrics_by_step(full), metrics_by_step(first) + metrics_by_step(rest))


def test_cli_train_logs_to_mlflow(tmp_path, cache):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cmd = [sys.executable, "-m", "ragen2_core.cli", "train", "--tracking-uri", uri,
           *sum((["--set", o] for o in TINY + [f"policy.cache_dir={cache}", f"train.output_dir={tmp_path}/run",
                                                "train.steps=2", "tracking.experiment=smoke"]), [])]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_id = json.loads((tmp_path / "run" / "mlflow_run.json").read_text())["run_id"]
    client = MlflowClient(uri)
    r = client.get_run(run_id)
    assert r.info.status == "FINISHED"
    assert r.data.params["rollout.group_size"] == "3" and r.data.params["algo.advantage"] == "grpo"
    for tag in ("ragen2.seed", "ragen2.config_hash", "ragen2.git_sha", "ragen2.torch", "ragen2.transformers",
                "ragen2.deepspeed"):
        assert tag in r.data.tags, tag
    assert [m.step for m in client.get_metric_history(run_id, "rollout/success")] == [1, 2]
    assert "eval/success" in r.data.metrics
    arts = {a.path for a in client.list_artifacts(run_id)}
    assert {"config.yaml", "policy", "samples"} <= arts


def test_bad_config_exits_2_before_any_work(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "ragen2_core.cli", "train", "--set", "rollout.group_sise=4",
                           "--set", "algo.kl_coef=-1", "--set", f"train.output_dir={tmp_path}/never"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "rollout.group_sise" in proc.stderr and "group_size" in proc.stderr and "algo.kl_coef" in proc.stderr
    assert not (tmp_path / "never").exists()


def test_length_sorted_scoring_equals_one_full_forward():
    from ragen2_core.algo.losses import logp_from_logits
    from ragen2_core.train.scoring import score_tokens
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1)).eval()
    lengths = [9, 3, 6, 9, 2]
    ids = torch.randint(1, 50, (5, 9))
    attn = (torch.arange(9)[None] < torch.tensor(lengths)[:, None]).long()
    ids = ids * attn  # right padding with id 0
    logp, _ = score_tokens(model, {"input_ids": ids, "attention_mask": attn}, micro=2)
    with torch.no_grad():
        full = logp_from_logits(model(input_ids=ids, attention_mask=attn).logits[:, :-1].float(), ids[:, 1:])
    valid = attn[:, 1:].bool()
    torch.testing.assert_close(logp[valid], full[valid], atol=1e-5, rtol=1e-5)
    assert (logp[~valid] == 0).all()


def test_shared_prefix_update_equals_the_plain_update(tmp_path, cache):
    # PPO with a reference (KL in the loss) and two epochs exercises every shared-prompt path:
    # behaviour scoring, reference scoring and the update; metrics must agree with the plain path.
    common = ["train.steps=2", "algo.kl_coef=0.05", "algo.ppo_epochs=2", "collapse.every=0"]
    a, b = MemorySink(), MemorySink()
    run(cfg_for(tmp_path / "shared", cache, *common, "train.shared_prefix=true"), a)
    run(cfg_for(tmp_path / "plain", cache, *common, "train.shared_prefix=false"), b)
    for (_, x), (_, y) in zip(metrics_by_step(a), metrics_by_step(b)):
        for k in x:
            if k.startswith(("actor/", "rollout/", "eval/")):
                assert x[k] == pytest.approx(y[k], rel=1e-3, abs=1e-5, nan_ok=True), k


def test_shared_prefix_ppo_with_critic_equals_the_plain_update(tmp_path, cache):
    # GAE: the critic's values (behaviour pass and the update's) go through the shared prompts too.
    common = ["train.steps=2", "algo.advantage=gae", "algo.ppo_epochs=2", "algo.mini_batches=2",
              "collapse.every=0"]
    a, b = MemorySink(), MemorySink()
    run(cfg_for(tmp_path / "shared", cache, *common, "train.shared_prefix=true"), a)
    run(cfg_for(tmp_path / "plain", cache, *common, "train.shared_prefix=false"), b)
    for (_, x), (_, y) in zip(metrics_by_step(a), metrics_by_step(b)):
        assert math.isfinite(x["critic/value_loss"])
        for k in x:
            if k.startswith(("actor/", "critic/", "rollout/")):
                assert x[k] == pytest.approx(y[k], rel=1e-3, abs=1e-5, nan_ok=True), k


def test_critic_warmup_freezes_the_actor_only(tmp_path, cache):
    # A one-step run that is all warm-up: the critic trains (its loss is logged), the exported actor
    # equals its starting point.
    run(cfg_for(tmp_path, cache, "train.steps=1", "algo.advantage=gae", "algo.critic_warmup=1", "collapse.every=0"),
        sink := MemorySink())
    start = AutoModelForCausalLM.from_pretrained(next(cache.glob("embedded-*")))
    trained = AutoModelForCausalLM.from_pretrained(tmp_path / "policy")
    assert all(torch.equal(p, q) for p, q in zip(start.parameters(), trained.parameters()))
    m = sink.metrics[0][1]
    assert math.isnan(m["actor/grad_norm"]) and math.isfinite(m["critic/value_loss"]) and math.isfinite(m["actor/entropy"])
