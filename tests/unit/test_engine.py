"""TrainEngine / FrozenModel on CPU, single process (gloo, world size 1).

    DS_ACCELERATOR=cpu python3 -m pytest tests/unit/test_engine.py -q

A one-process group skips DeepSpeed's shared-memory comm op (its JIT build took about a minute
on a machine's first start); the 2-rank tests under torchrun still build it once.
"""
import json
import os
import subprocess
import sys
import math
import random

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from ragen2_core.train.engine import FrozenModel, TrainEngine, ds_config

STAGES = [0, 1, 2, 3]


def tiny_lm(seed: int = 0) -> Qwen2ForCausalLM:
    config = Qwen2Config(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, intermediate_size=32, max_position_embeddings=64,
                         tie_word_embeddings=True)
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)


def lm_batch(n: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 64, (n, 8), generator=torch.Generator().manual_seed(seed))


def make_engine(model, **overrides) -> TrainEngine:
    kw = dict(lr=1e-2, zero_stage=0, grad_accum=1, micro_batch_size=2, max_grad_norm=1.0)
    return TrainEngine(model, **{**kw, **overrides})


def lm_step(engine: TrainEngine, ids: torch.Tensor) -> float:
    loss = engine.forward(input_ids=ids, labels=ids).loss
    engine.backward(loss)
    engine.step()
    return loss.item()


def params(engine: TrainEngine) -> dict[str, torch.Tensor]:
    return engine.state_dict_for_export()  # gathered under ZeRO-3, where module params are empty shards


def assert_same(a: dict, b: dict, atol: float = 0.0) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=atol, msg=k)


def adam_state(engine: TrainEngine) -> list[tuple[float, torch.Tensor, torch.Tensor]]:
    """(step, exp_avg, exp_avg_sq) per tensor of the torch AdamW inside DeepSpeed's (ZeRO) wrapper."""
    inner = getattr(engine.engine.optimizer, "optimizer", engine.engine.optimizer)
    out = []
    for group in inner.param_groups:
        for p in group["params"]:
            s = inner.state[p]
            out.append((float(s["step"]), s["exp_avg"].clone(), s["exp_avg_sq"].clone()))
    return out


# ----------------------------------------------------------------------------- config

def test_ds_config_generated_values(tmp_path):
    cfg = ds_config(lr=3e-4, zero_stage=2, grad_accum=4, micro_batch_size=2, max_grad_norm=0.7, user_config=None)
    assert cfg["optimizer"]["type"] == "AdamW"
    assert cfg["optimizer"]["params"]["lr"] == 3e-4
    assert cfg["optimizer"]["params"]["torch_adam"] is (not torch.cuda.is_available())
    assert cfg["zero_optimization"]["stage"] == 2
    assert cfg["gradient_clipping"] == 0.7
    assert (cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]) == (2, 4)
    assert cfg["train_batch_size"] == 8  # one process
    assert cfg["bf16"]["enabled"] is False


def test_ds_config_user_file_wins_and_keeps_batch_consistent(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"gradient_accumulation_steps": 3, "optimizer": {"params": {"weight_decay": 0.1}}}))
    cfg = ds_config(lr=1e-3, zero_stage=1, grad_accum=1, micro_batch_size=2, max_grad_norm=1.0, user_config=str(path))
    assert cfg["optimizer"]["params"]["weight_decay"] == 0.1
    assert cfg["optimizer"]["params"]["lr"] == 1e-3  # deep merge: sibling keys survive
    assert cfg["train_batch_size"] == 2 * 3

    path.write_text(json.dumps({"train_batch_size": 5}))
    with pytest.raises(ValueError, match="train_batch_size 5"):
        ds_config(lr=1e-3, zero_stage=1, grad_accum=1, micro_batch_size=2, max_grad_norm=1.0, user_config=str(path))


# ----------------------------------------------------------------------------- training

def test_actor_step_changes_params_and_frozen_copy_does_not():
    model = tiny_lm()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ref = FrozenModel(model)
    actor = make_engine(model)
    assert (actor.rank, actor.world_size) == (0, 1)
    lm_step(actor, lm_batch(2))

    after = params(actor)
    assert any(not torch.equal(after[k], before[k]) for k in before)
    assert all(torch.equal(v, before[k]) for k, v in ref.module.state_dict().items())
    assert not any(p.requires_grad for p in ref.module.parameters())
    assert not ref.module.training
    ids = lm_batch(2)
    logits = ref.logits(input_ids=ids)
    assert logits.shape == (2, 8, 64) and not logits.requires_grad


@pytest.mark.parametrize("stage", STAGES)
def test_each_zero_stage_reduces_loss(stage):
    engine = make_engine(tiny_lm(), zero_stage=stage)
    assert engine.zero_stage == stage
    ids = lm_batch(2)
    losses = [lm_step(engine, ids) for _ in range(10)]
    assert all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0] - 0.1, losses
    assert math.isfinite(engine.grad_norm()) and engine.grad_norm() > 0
    assert engine.lr() == pytest.approx(1e-2)
    exported = params(engine)
    assert {k: v.shape for k, v in exported.items()} == {k: v.shape for k, v in tiny_lm().state_dict().items()}


@pytest.mark.parametrize("stage", STAGES)
def test_grad_accum_matches_one_big_micro_batch(stage):
    """Two micro-batches of 1 with grad_accum=2 must equal one micro-batch of 2.

    AdamW is invariant to a constant gradient scale, so equal parameters alone would not catch a
    missing (or doubled) 1/grad_accum factor; the pre-clip gradient norm does: it would come out
    2x (or 0.5x). Equal parameters after two windows show both micro-batches were accumulated.
    """
    ids = lm_batch(2)
    big = make_engine(tiny_lm(), zero_stage=stage, grad_accum=1, micro_batch_size=2)
    acc = make_engine(tiny_lm(), zero_stage=stage, grad_accum=2, micro_batch_size=1)
    start = params(acc)
    for window in range(2):
        lm_step(big, ids)
        assert acc.is_boundary() is False
        loss = acc.forward(input_ids=ids[:1], labels=ids[:1]).loss
        acc.backward(loss)
        assert acc.step() is False
        if window == 0:
            assert_same(params(acc), start)  # nothing applied mid-window
        assert acc.is_boundary() is True
        loss = acc.forward(input_ids=ids[1:], labels=ids[1:]).loss
        acc.backward(loss)
        assert acc.step() is True
        assert acc.grad_norm() == pytest.approx(big.grad_norm(), rel=1e-5)
        if window == 0:
            assert any(not torch.equal(v, start[k]) for k, v in params(acc).items())
    assert_same(params(acc), params(big), atol=1e-5)


@pytest.mark.parametrize("stage", [0, 2, 3])
def test_bf16_trains_and_exports_fp32_masters(stage):
    engine = make_engine(tiny_lm(), zero_stage=stage, bf16=True)
    ids = lm_batch(2)
    losses = [lm_step(engine, ids) for _ in range(5)]
    assert losses[-1] < losses[0] - 0.1, losses
    exported = params(engine)
    # bf16-rounded module weights would survive a bf16 round trip unchanged; fp32 masters do not.
    for name in ("model.embed_tokens.weight", "lm_head.weight"):  # tied: both names carry the master
        assert exported[name].dtype == torch.float32
        assert not torch.equal(exported[name], exported[name].bfloat16().float()), name


def test_zero3_module_generates_and_refuses_a_late_frozen_copy():
    engine = make_engine(tiny_lm(), zero_stage=3)
    lm_step(engine, lm_batch(2))
    with torch.no_grad():  # forward hooks gather the partitioned weights
        out = engine.module.generate(lm_batch(2)[:, :4], max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert out.shape == (2, 7)
    with pytest.raises(ValueError, match="before TrainEngine"):
        FrozenModel(engine.module)


def test_user_json_reaches_the_engine(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"gradient_clipping": 0.5, "optimizer": {"params": {"weight_decay": 0.01}}}))
    engine = make_engine(tiny_lm(), user_config=str(path))
    assert engine.engine.gradient_clipping() == 0.5
    group = engine.engine.optimizer.param_groups[0]
    assert group["weight_decay"] == 0.01 and group["lr"] == pytest.approx(1e-2)


# ----------------------------------------------------------------------------- checkpoints

@pytest.mark.parametrize("stage", [0, 2, 3])
def test_save_load_resumes_exactly(tmp_path, stage):
    ids = lm_batch(2)
    first = make_engine(tiny_lm(seed=0), zero_stage=stage)
    for _ in range(2):
        lm_step(first, ids)
    client = {"step": 2, "torch_rng": torch.get_rng_state(), "py_rng": random.getstate()}
    first.save(tmp_path, "step2", client_state=client)
    saved_params, saved_adam = params(first), adam_state(first)
    lm_step(first, ids)

    resumed = make_engine(tiny_lm(seed=7), zero_stage=stage)  # different init: the load must overwrite it
    got = resumed.load(tmp_path, "step2")
    assert got["step"] == 2 and got["py_rng"] == client["py_rng"]
    assert torch.equal(got["torch_rng"], client["torch_rng"])
    assert_same(params(resumed), saved_params)
    for (step_a, m_a, v_a), (step_b, m_b, v_b) in zip(saved_adam, adam_state(resumed), strict=True):
        assert step_a == step_b == 2
        assert torch.equal(m_a, m_b) and torch.equal(v_a, v_b)

    lm_step(resumed, ids)
    assert_same(params(resumed), params(first))


def test_load_missing_checkpoint_raises(tmp_path):
    engine = make_engine(tiny_lm())
    with pytest.raises(FileNotFoundError):
        engine.load(tmp_path, "nope")


@pytest.mark.parametrize("stage", [0, 3])
def test_export_reloads_with_save_pretrained(tmp_path, stage):
    engine = make_engine(tiny_lm(), zero_stage=stage)
    ids = lm_batch(2)
    lm_step(engine, ids)
    engine.module.save_pretrained(tmp_path, state_dict=engine.state_dict_for_export())
    reloaded = Qwen2ForCausalLM.from_pretrained(tmp_path)
    with torch.no_grad():
        expected = engine.module(input_ids=ids).logits
        torch.testing.assert_close(reloaded(input_ids=ids).logits, expected)


def test_one_process_group_skips_deepspeeds_shared_memory_op():
    # In a fresh process: DeepSpeed's comm backend does not build the shared-memory allreduce op for
    # a group of one, and where it probes its ops lazily (0.19.8 on: `_probe_compatible_ops`), the
    # probe (compiler test runs) does not run either; the group still works.
    code = ("import deepspeed.comm as dist, deepspeed.comm.comm as backend, torch, deepspeed\n"
            "from ragen2_core.train.engine import init_distributed\n"
            "assert init_distributed() == (0, 1)\n"
            "t = torch.ones(3); dist.all_reduce(t); assert t.tolist() == [1.0, 1.0, 1.0]\n"
            "ops = deepspeed.ops.__compatible_ops__\n"
            "lazy = hasattr(deepspeed.ops, '_probe_compatible_ops')\n"
            "print(backend.cdb.shm_comm_op, ops['deepspeed_shm_comm'], lazy, len(ops) if lazy else '-')\n"
            # Left to interpreter exit, gloo's threads have once aborted the process (status -6).
            "torch.distributed.destroy_process_group()\n")
    assert _last_line_in_fresh_process(code) in ("None False True 1", "None False False -")


def test_shutdown_destroys_the_group_and_a_later_run_can_start_another():
    # `ragen2 train` ends with shutdown_distributed(); a caller that runs train again in the same
    # process (a notebook, a test) must get a fresh, working group, DeepSpeed's comm layer included.
    code = ("import deepspeed.comm as dist, torch\n"
            "from ragen2_core.train.engine import init_distributed, shutdown_distributed\n"
            "assert init_distributed() == (0, 1)\n"
            "shutdown_distributed(); assert not torch.distributed.is_initialized()\n"
            "shutdown_distributed()\n"  # a second call is a no-op, not an error
            "assert init_distributed() == (0, 1)\n"
            "t = torch.full((2,), 3.0); dist.all_reduce(t); assert t.tolist() == [3.0, 3.0]\n"
            "shutdown_distributed(); print('ok')\n")
    assert _last_line_in_fresh_process(code) == "ok"


def _last_line_in_fresh_process(code: str) -> str:
    """Run ``code`` in a new interpreter with no launcher variables (so init_distributed takes its
    one-process path); returns the last line it printed."""
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    done = subprocess.run([sys.executable, "-c", code], env=env | {"DS_ACCELERATOR": "cpu"},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]
