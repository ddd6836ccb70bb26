"""Data-parallel TrainEngine run used by tests/smoke/test_engine_torchrun.py.

    OMP_NUM_THREADS=1 torchrun --nproc_per_node 2 tests/smoke/_engine_worker.py OUT_DIR
    python tests/smoke/_engine_worker.py OUT_DIR --reference      # one process, whole batch

Each rank trains STEPS steps with ZeRO stage STAGE on its own shard of a fixed batch and writes
OUT_DIR/rank{r}.pt with its world size, the initial and the final parameters. The reference run
trains one process on the whole batch, which data-parallel averaging must reproduce.
"""
import sys

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from ragen2_core.train.engine import TrainEngine, init_distributed

STAGE, STEPS, SHARD, WORLD = 2, 3, 2, 2


def flat(state: dict) -> torch.Tensor:
    return torch.cat([state[k].flatten() for k in sorted(state)])


def main(out_dir: str, reference: bool) -> None:
    rank, world = init_distributed()
    config = Qwen2Config(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, intermediate_size=32, max_position_embeddings=64)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    ids = torch.randint(0, 64, (SHARD * WORLD, 8), generator=torch.Generator().manual_seed(1))
    shard = ids if reference else ids[rank * SHARD:(rank + 1) * SHARD]
    engine = TrainEngine(model, lr=1e-2, zero_stage=STAGE, grad_accum=1, micro_batch_size=len(shard),
                         max_grad_norm=1.0)
    initial = flat(engine.state_dict_for_export())
    for _ in range(STEPS):
        loss = engine.forward(input_ids=shard, labels=shard).loss
        engine.backward(loss)
        engine.step()
    final = flat(engine.state_dict_for_export())
    name = "reference" if reference else f"rank{rank}"
    torch.save({"rank": engine.rank, "world_size": engine.world_size, "initial": initial, "final": final},
               f"{out_dir}/{name}.pt")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], "--reference" in sys.argv[2:])
