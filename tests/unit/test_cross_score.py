"""Cross-scoring for the MI proxy, the rollout dump format and offline ``ragen2 mi``.

A random-init tiny Qwen2 is enough: the cached scorer must equal the uncached one whatever the
weights say, and the bookkeeping (rows, groups, spans, files) does not depend on the policy.
"""
import json
import math

import numpy as np
import pytest
import torch

from ragen2_core import mi_offline
from ragen2_core.envs.registry import make_env
from ragen2_core.metrics.collapse import collapse_metrics, mi_from_scores, mi_zscore
from ragen2_core.policy.model import build_tiny_qwen2, save_policy
from ragen2_core.policy.tokenizer import train_tokenizer
from ragen2_core.rollout.cross_score import (_micro_batches, cross_score, cross_score_naive,
                                             first_turn_reasonings, score_batch)
from ragen2_core.rollout.dump import dump_rollouts, load_rollouts
from ragen2_core.rollout.prompt import first_chunk, next_chunk
from ragen2_core.batches import RolloutBatch

COLLAPSE_KEYS = {"mi", "mi_per_token", "mi_upper_bound", "mi_zscore", "mi_zscore_seq", "marginal_std",
                 "marginal_std_seq", "mi_perm_zscore", "mi_perm_zscore_per_token",
                 "retrieval_acc", "retrieval_chance", "cond_entropy", "marginal_entropy",
                 "cond_entropy_per_token", "marginal_entropy_per_token"}
SEEDS = [1, 2, 3, 4]


def prompt(seed):
    env = make_env("frozenlake", slip=0.0)
    return first_chunk(env.system_prompt(), env.reset(seed), 10, 16)


@pytest.fixture(scope="module")
def policy():
    texts = [prompt(s) for s in range(20)] + ["I am at (0, 1) so go down</think><answer>Down</answer>"]
    tok = train_tokenizer(texts, vocab_size=300)
    model = build_tiny_qwen2(tok, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                             intermediate_size=64, seed=0).eval()
    return model, tok


def make_batch(tok, group_seeds, k, turns=2):
    """k two-turn episodes per group, shaped like the engine's output; row 1 thinks nothing."""
    enc = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    close = enc("</think>")[0]
    f = {n: [] for n in ("token_ids", "response_mask", "token_rewards", "think_spans", "responses")}
    f |= {"group_ids": [], "env_seeds": [], "prompt_len": []}
    for g, seed in enumerate(group_seeds):
        for s in range(k):
            ids, mask, spans, replies = [], [], [], []
            for t in range(turns):
                chunk = enc(prompt(seed) if t == 0 else next_chunk(0.0, t + 1, "board", 9, 16))
                think = "" if (g, s) == (0, 1) else f" turn {t} at ({g}, {s}) so go down" * (1 + s % 2)
                reply = enc(think + "</think><answer>Down</answer>")
                start = len(ids) + len(chunk)
                spans.append((start, start + reply.index(close)))
                ids += chunk + reply
                mask += [0] * len(chunk) + [1] * len(reply)
                replies.append("<think>" + tok.decode(reply))
            f["token_ids"].append(ids), f["response_mask"].append(mask)
            f["token_rewards"].append([0.0] * len(ids)), f["think_spans"].append(spans)
            f["responses"].append(replies), f["group_ids"].append(g), f["env_seeds"].append(seed)
            f["prompt_len"].append(spans[0][0])
    n = len(f["token_ids"])
    return RolloutBatch(**f, episode_reward=[0.5 * (b % 3) for b in range(n)],
                        success=[b % 3 == 2 for b in range(n)], n_turns=[turns] * n,
                        n_valid_turns=[turns] * n, truncated=[False] * n)


# ---------------------------------------------------------------- cross_score


def test_cached_scores_equal_naive_scores_across_micro_batches(policy):
    model, _ = policy
    g = torch.Generator().manual_seed(1)
    rand = lambda n: torch.randint(0, 290, (n,), generator=g).tolist()  # noqa: E731
    contexts = [rand(n) for n in (5, 9, 13)]
    reasonings = [rand(n) for n in (3, 0, 7, 1, 12, 4)]       # K = 2, one empty, one of length 1
    assert len(_micro_batches(reasonings, 10)) >= 3
    model.train()
    fast = cross_score(model, contexts, reasonings, k=2, token_budget=10)
    assert model.training                                     # mode restored
    model.eval()
    slow = cross_score_naive(model, contexts, reasonings, k=2)
    assert fast.shape == (3, 2, 3) and fast.dtype == torch.float64
    assert (fast - slow).abs().max().item() <= 1e-5
    assert (fast[0, 1] == 0).all()                            # empty reasoning scores 0
    assert (fast[[0, 1, 2, 2], [0, 0, 0, 1]] < 0).all()
    one_batch = cross_score(model, contexts, reasonings, k=2, token_budget=10_000)
    assert (fast - one_batch).abs().max().item() <= 1e-5           # batching changes only rounding


def test_prompt_blind_scores_give_zero_mi(policy):
    model, _ = policy
    g = torch.Generator().manual_seed(2)
    ctx = torch.randint(0, 290, (8,), generator=g).tolist()
    reasonings = [torch.randint(0, 290, (n,), generator=g).tolist() for n in (4, 6, 2, 5, 3, 7)]
    scores = cross_score(model, [ctx] * 3, reasonings, k=2, token_budget=12)
    # The same context is the same computation, so the scores are bit-identical across prompts.
    assert torch.equal(scores, scores[:, :, :1].expand_as(scores))
    m = mi_from_scores(scores)
    assert m["mi"] == 0.0
    assert m["retrieval_acc"] == pytest.approx(m["retrieval_chance"])
    assert mi_zscore(scores, n_perm=8, seed=0)["zscore"] == 0.0


def test_bad_shapes_are_named(policy):
    model, _ = policy
    with pytest.raises(ValueError, match="N\\*K"):
        cross_score(model, [[1, 2], [3]], [[4]] * 3, k=2)
    with pytest.raises(ValueError, match="empty"):
        cross_score(model, [[1, 2], []], [[4]] * 2, k=1)


# ---------------------------------------------------------------- rows and spans


def test_first_turn_and_trajectory_reasonings(policy):
    _, tok = policy
    batch = make_batch(tok, SEEDS[:2], k=2)
    ctx, first = first_turn_reasonings(batch, [0, 2])
    _, traj = first_turn_reasonings(batch, [0, 2], trajectory=True)
    for c, z, zz, b in zip(ctx, first, traj, [0, 2]):
        (s0, e0), (s1, e1) = batch.think_spans[b]
        assert c == batch.token_ids[b][:s0] and tok.decode(c).endswith("<think>")
        assert z == batch.token_ids[b][s0:e0] and "</think>" not in tok.decode(z)
        assert zz == z + batch.token_ids[b][s1:e1]
    assert first_turn_reasonings(batch, [1])[1] == [[]]       # the row that thinks nothing
    batch.think_spans[3] = []
    ctx, z = first_turn_reasonings(batch, [3])
    assert z == [[]] and ctx[0] == batch.token_ids[3][:batch.prompt_len[3]]


def test_score_batch_picks_distinct_groups_deterministically(policy):
    model, tok = policy
    batch = make_batch(tok, SEEDS + [SEEDS[0]], k=3, turns=1)   # group 4 repeats group 0's prompt
    runs = [score_batch(model, batch, n_prompts=8, k_samples=2, rng=np.random.default_rng(7),
                        token_budget=64) for _ in range(2)]
    (scores, lengths, rows), (scores2, _, rows2) = runs
    assert rows == rows2 and torch.equal(scores, scores2)
    assert scores.shape == (4, 2, 4) and lengths.shape == (4, 2) and lengths.dtype == torch.long
    groups = [batch.group_ids[r] for r in rows]
    assert len(set(rows)) == 8 and groups == sorted(groups)
    assert set(groups) == {0, 1, 2, 3}                           # group 4 repeats group 0's prompt
    assert all(groups[2 * i] == groups[2 * i + 1] for i in range(4))
    _, z = first_turn_reasonings(batch, rows)
    assert lengths.flatten().tolist() == [len(x) for x in z]
    picks = {tuple(score_batch(model, batch, n_prompts=2, k_samples=3, rng=np.random.default_rng(s))[2])
             for s in range(6)}
    assert len(picks) > 1                                       # the rng does choose


def test_score_batch_needs_two_prompts(policy):
    model, tok = policy
    batch = make_batch(tok, [SEEDS[0], SEEDS[0]], k=2, turns=1)
    with pytest.raises(ValueError, match="at least 2 groups with distinct prompts"):
        score_batch(model, batch, n_prompts=4, k_samples=2, rng=np.random.default_rng(0))


# ---------------------------------------------------------------- dump / load


def test_dump_load_round_trip(policy, tmp_path):
    _, tok = policy
    batch = make_batch(tok, SEEDS[:2], k=2)
    path = tmp_path / "sub" / "rollouts.jsonl"
    dump_rollouts(batch, tok, path, step=3)
    dump_rollouts(batch.select([0]), tok, path, step=4)
    eps = load_rollouts(path)
    assert [e["step"] for e in eps] == [3, 3, 3, 3, 4]
    for b, e in enumerate(eps[:4]):
        (s0, e0), (s1, e1) = batch.think_spans[b]
        assert e["group_id"] == batch.group_ids[b] and e["env_seed"] == batch.env_seeds[b]
        assert e["episode_reward"] == batch.episode_reward[b] and e["success"] == batch.success[b]
        assert e["context_ids"] == batch.token_ids[b][:s0]
        assert e["reasoning_ids"] == batch.token_ids[b][s0:e0]
        assert e["reasonings_ids"][1] == batch.token_ids[b][s1:e1]
        assert e["context"] == prompt(batch.env_seeds[b]) and e["context"].endswith("<think>")
        assert tok.encode(e["context"], add_special_tokens=False) == e["context_ids"]
        assert e["reasoning"] == e["reasonings"][0] and e["responses"] == batch.responses[b]
    assert eps[1]["reasoning"] == ""


def test_load_rollouts_names_the_bad_line(policy, tmp_path):
    _, tok = policy
    path = tmp_path / "r.jsonl"
    dump_rollouts(make_batch(tok, SEEDS[:1], k=1, turns=1), tok, path, step=1)
    good = path.read_text()
    path.write_text(good + "\n{not json\n")
    with pytest.raises(ValueError, match=r"r\.jsonl:3: not valid JSON"):
        load_rollouts(path)
    rec = json.loads(good)
    del rec["reasoning"]
    path.write_text(good + json.dumps(rec) + "\n")
    with pytest.raises(ValueError, match=r"r\.jsonl:2: missing field\(s\) reasoning;"):
        load_rollouts(path)
    with pytest.raises(FileNotFoundError, match="dump_rollouts=true"):
        load_rollouts(tmp_path / "nope.jsonl")


# ---------------------------------------------------------------- offline ragen2 mi


@pytest.fixture()
def dumped(policy, tmp_path):
    model, tok = policy
    policy_dir = tmp_path / "policy"
    save_policy(model, tok, policy_dir, meta={"test": True})
    batch = make_batch(tok, SEEDS, k=3)
    dump_rollouts(make_batch(tok, SEEDS[:2], k=1), tok, tmp_path / "r.jsonl", step=1)
    dump_rollouts(batch, tok, tmp_path / "r.jsonl", step=2)
    return batch, policy_dir, tmp_path / "r.jsonl"


def last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_offline_mi_end_to_end(policy, dumped, capsys):
    model, tok = policy
    batch, policy_dir, path = dumped
    base = ["--rollouts", str(path), "--model", str(policy_dir), "--n-prompts", "3", "--k-samples",
            "2", "--n-perm", "8", "--seed", "5", "--threads", "1"]
    assert mi_offline.main(base) == 0
    out = capsys.readouterr().out
    res = last_json(out)
    assert COLLAPSE_KEYS <= res.keys() and res["step"] == 2
    assert (res["n_prompts"], res["k_samples"]) == (3, 2)
    assert all(math.isfinite(res[k]) for k in COLLAPSE_KEYS)
    assert res["cost"]["full"]["scored_tokens"] > res["cost"]["matched"]["scored_tokens"] > 0
    assert "cond_entropy" in out and "N*K*N scores" in out
    # Stored ids under the policy that rolled out: exactly the in-training numbers.
    assert mi_offline.main(base + ["--ids"]) == 0
    res_ids = last_json(capsys.readouterr().out)
    scores, lengths, _ = score_batch(model, batch, n_prompts=3, k_samples=2, rng=np.random.default_rng(5))
    online = collapse_metrics(scores, lengths=lengths, n_perm=8, seed=5)
    assert {k: res_ids[k] for k in COLLAPSE_KEYS} == pytest.approx({k: online[k] for k in COLLAPSE_KEYS}, abs=1e-9)
    assert mi_offline.main(base + ["--trajectory", "--step", "1"]) == 0
    res_traj = last_json(capsys.readouterr().out)
    assert res_traj["trajectory"] and res_traj["n_prompts"] == 2 and res_traj["k_samples"] == 1


def test_offline_ids_reproduce_a_dumped_training_step(policy, tmp_path, capsys):
    """The trainer dumps exactly the scored rows; taking them all back gives the same numbers."""
    model, tok = policy
    batch = make_batch(tok, SEEDS, k=3)
    scores, lengths, rows = score_batch(model, batch, n_prompts=3, k_samples=2, rng=np.random.default_rng(1))
    dump_rollouts(batch.select(rows), tok, tmp_path / "r.jsonl", step=7)
    policy_dir = tmp_path / "policy"
    save_policy(model, tok, policy_dir, meta={})
    assert mi_offline.main(["--rollouts", str(tmp_path / "r.jsonl"), "--model", str(policy_dir), "--ids",
                            "--n-prompts", "99", "--k-samples", "99", "--n-perm", "8", "--seed", "11"]) == 0
    res = last_json(capsys.readouterr().out)
    assert (res["n_prompts"], res["k_samples"]) == (3, 2)
    online = collapse_metrics(scores, lengths=lengths, n_perm=8, seed=11)
    assert {k: res[k] for k in COLLAPSE_KEYS} == pytest.approx({k: online[k] for k in COLLAPSE_KEYS}, abs=1e-9)


def test_offline_mi_errors_exit_2(dumped, tmp_path, capsys):
    _, policy_dir, path = dumped
    run = lambda *a: mi_offline.main(["--model", str(policy_dir), *a])  # noqa: E731
    assert run("--rollouts", str(tmp_path / "missing.jsonl")) == 2
    assert "not found" in capsys.readouterr().err
    assert run("--rollouts", str(path), "--step", "9") == 2
    assert "steps present: [1, 2]" in capsys.readouterr().err
    one = tmp_path / "one.jsonl"
    one.write_text("".join(line + "\n" for line in path.read_text().splitlines()[-3:]))
    assert run("--rollouts", str(one)) == 2
    assert "at least 2 groups" in capsys.readouterr().err
    assert mi_offline.main(["--rollouts", str(path), "--model", str(tmp_path / "no_model")]) == 2
    assert "cannot load --model" in capsys.readouterr().err
