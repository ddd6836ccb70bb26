"""Every bad input of issue 31 is refused by the preflight (train/preflight.py) before anything is
created: exit status 2, a message naming the field, the value and the fix, and no store, run, output
folder or stray file left behind."""
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ragen2_core import outputs
from ragen2_core.cli import main as cli
from ragen2_core.config import load_config
from ragen2_core.mi_offline import main as mi
from ragen2_core.sweep.driver import main as sweep
from ragen2_core.sweep.spec import SpecError
from ragen2_core.sweep.trials import count_trials, expand, iter_trials, load_spec
from ragen2_core.train import memory
from ragen2_core.train import preflight as pf
from ragen2_core.ui import main as ui

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "sweeps" / "base" / "frozenlake_tiny.yaml"


def contents(where: Path) -> list[str]:
    return sorted(str(p.relative_to(where)) for p in where.rglob("*"))


def train(tmp_path, *sets: str, extra: tuple = ()) -> int:
    """`ragen2 train` in tmp_path with the default store and output folder there."""
    args = ["train", "--set", f"policy.cache_dir={tmp_path / 'cache'}"]
    for s in sets:
        args += ["--set", s]
    return cli(args + list(extra))


@pytest.fixture
def cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path


# ---------------------------------------------------------------------------- the policy

def test_an_empty_model_folder_is_refused_by_train_and_eval(cwd, capsys):
    (cwd / "model").mkdir()
    assert train(cwd, "policy.model=model") == 2
    assert cli(["eval", "--set", "policy.model=model"]) == 2
    err = capsys.readouterr().err
    assert err.count("policy.model: the folder 'model' holds no weights") == 2 and "save_pretrained" in err
    assert contents(cwd) == ["model"]


def test_eval_refuses_more_episodes_than_the_validation_set_and_a_negative_show(cwd, capsys):
    assert cli(["eval", "--set", "env.val_seeds=50", "--episodes", "60", "--show", "-1"]) == 2
    err = capsys.readouterr().err
    assert "--episodes 60: the validation set holds env.val_seeds=50 seeds" in err and "--set env.val_seeds=N" in err
    assert "--show -1:" in err and contents(cwd) == []


def test_a_garbage_model_folder_is_refused(cwd, capsys):
    model = cwd / "model"
    model.mkdir()
    (model / "config.json").write_text("{not json")
    (model / "model.safetensors").write_bytes(b"\0" * 64)
    assert train(cwd, "policy.model=model") == 2
    err = capsys.readouterr().err
    assert "policy.model: cannot load 'model'" in err and "an HF model name, a .gguf file, or embedded" in err
    assert contents(cwd) == ["model", "model/config.json", "model/model.safetensors"]


def test_a_model_folder_that_loads_passes(tmp_path):
    shipped = next((ROOT / "ragen2_core" / "policy" / "shipped").glob("embedded-*"))
    cfg = load_config(None, [f"policy.model={shipped}"])
    shape, problems = pf.policy_problems(cfg)
    assert problems == [] and (shape.hidden, shape.layers, shape.vocab) == (128, 4, 712)


# ---------------------------------------------------------------------------- seeds

@pytest.mark.parametrize("key", ["train.seed", "warmstart.seed", "env.val_seed_start"])
@pytest.mark.parametrize("value", ["100000000000000000000000", "-1", str(2**32)])
def test_seeds_out_of_range_are_refused(key, value, cwd, capsys):
    assert train(cwd, f"{key}={value}") == 2
    err = capsys.readouterr().err
    assert f"{key}: {value} is out of range; it must be >= 0 and <= 4294967295" in err
    assert contents(cwd) == []


def test_the_largest_seed_is_accepted():
    assert load_config(None, [f"train.seed={2**32 - 1}"]).train.seed == 2**32 - 1


@pytest.mark.parametrize("seeds", ["[0, -1]", f"[{2**32}]"])
def test_sweep_seeds_out_of_range_are_refused(seeds, cwd):
    path = spec_file(cwd, f"seeds: {seeds}\n")
    with pytest.raises(SpecError, match=r"seeds: .* is out of range; a seed is a whole number from 0 to 4294967295"):
        load_spec(path)
    with pytest.raises(SpecError, match=r"search.seed: -1 is out of range"):
        load_spec(spec_file(cwd, "search: {kind: random, samples: 2, seed: -1, space: {algo.kl_coef: {uniform: [0, 1]}}}\n"))


def test_mi_seed_out_of_range_is_refused(tmp_path, capsys):
    assert mi(["--rollouts", str(tmp_path / "r.jsonl"), "--model", "unused", "--seed", "-1"]) == 2
    assert "--seed must be between 0 and 4294967295; got -1" in capsys.readouterr().err


# ---------------------------------------------------------------------------- memory

def test_the_memory_estimate_by_hand():
    cfg = load_config(None)  # embedded default: 8 x 8 rows, 2048 tokens, hidden 128, 4 layers, 2 x 32 kv, vocab 1024
    need = memory.memory_need(cfg, memory.embedded_shape(cfg.policy))
    # kv: 64 rows x 2048 x 4 layers x 2 x 64 x 4 bytes; micro = 64 / (1 mini-batch x 4 accum) = 16 rows
    # activations: 16 x 2048 x 128 x 4 x 4; logits: 16 x 256 (logit_chunk) x 1024 x 4
    # weights: (1024 x 128 + 4 x (128 x (256 + 128) + 3 x 128 x 384)) x 4 = 917504 x 4
    assert need == {"kv_cache": 256 << 20, "activations": 64 << 20, "logits": 16 << 20, "weights": 917504 * 4}
    assert memory.memory_problems(cfg, memory.embedded_shape(cfg.policy), total=340 << 20) == []
    [problem] = memory.memory_problems(cfg, memory.embedded_shape(cfg.policy), total=300 << 20)
    assert "8 x 8 = 64 rows" in problem and "339.5 MiB" in problem and "300.0 MiB" in problem


def test_a_batch_no_machine_can_hold_is_refused(cwd, capsys):
    assert train(cwd, "rollout.n_groups=1000000000") == 2
    err = capsys.readouterr().err
    assert "rollout.n_groups x rollout.group_size: 1000000000 x 8 = 8,000,000,000 rows" in err
    assert "of memory; lower rollout.n_groups" in err and "--no-memory-check" in err
    assert contents(cwd) == []


def test_no_memory_check_skips_only_the_estimate(cwd, capsys):
    cfg = load_config(None, ["rollout.n_groups=1000000000"])
    assert not any("rollout.n_groups" in p for p in pf.config_problems(cfg, memory_check=False))
    # another problem still stops it, so nothing trains
    assert train(cwd, "rollout.n_groups=1000000000", extra=("--no-memory-check", "--tracking-uri", "ftp://x/y")) == 2
    err = capsys.readouterr().err
    assert "rollout.n_groups" not in err and "ftp://" in err
    assert contents(cwd) == []


# ---------------------------------------------------------------------------- the tracking store

@pytest.mark.parametrize("uri", ["ftp://x/y", "s3://bucket/mlflow", "gopher://x"])
def test_a_tracking_uri_mlflow_cannot_store_runs_in_is_refused(uri, cwd, capsys):
    assert train(cwd, extra=("--tracking-uri", uri)) == 2
    assert report_cli(["--experiment", "x", "--tracking-uri", uri]) == 2
    assert ui(["--tracking-uri", uri]) == 2
    err = capsys.readouterr().err
    assert err.count(f"'{uri}' has the scheme {uri.split(':')[0]}://, which MLflow keeps no runs under") == 3
    assert "sqlite:///path/mlflow.db" in err
    assert contents(cwd) == []


def report_cli(args: list[str]) -> int:
    return cli(["report"] + args)


def test_a_store_in_a_read_only_folder_is_refused_at_once(tmp_path):
    """A read-only mount (root: a private mount namespace; others: a folder without write permission)."""
    ro = tmp_path / "ro"
    ro.mkdir()
    command = [sys.executable, "-m", "ragen2_core.cli", "train", "--tracking-uri", f"sqlite:///{ro / 'mlflow.db'}",
               "--set", f"train.output_dir={tmp_path / 'out'}", "--set", f"policy.cache_dir={tmp_path / 'cache'}"]
    if os.geteuid() == 0:
        if not shutil.which("unshare"):
            pytest.fail("needs unshare (util-linux) to make a read-only mount as root", pytrace=False)
        quoted = " ".join(f"'{c}'" for c in command)
        command = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                   f"mount -t tmpfs -o ro,size=1m none '{ro}' && exec {quoted}"]
    else:
        ro.chmod(0o555)
    t0 = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env=dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu"))
    assert "mount:" not in done.stderr, f"could not make a read-only mount here: {done.stderr}"
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"tracking.uri: 'sqlite:///{ro / 'mlflow.db'}': the folder {ro} is not writable" in done.stderr
    assert time.monotonic() - t0 < 120  # no MLflow retry loop
    assert contents(tmp_path) == ["ro"]


def test_a_missing_store_folder_that_can_be_made_passes(tmp_path):
    assert outputs.tracking_problems(f"sqlite:///{tmp_path / 'new' / 'deeper' / 'mlflow.db'}") == []
    assert not (tmp_path / "new").exists()  # checked, not made
    (tmp_path / "file").write_text("x")
    [problem] = outputs.tracking_problems(f"sqlite:///{tmp_path / 'file' / 'mlflow.db'}")
    assert f"{tmp_path / 'file'} is a file" in problem


# ---------------------------------------------------------------------------- output folders

def test_an_output_folder_inside_git_is_refused(cwd, capsys):
    subprocess.run(["git", "init", "-q", str(cwd / "repo")], check=True)
    (cwd / "link").symlink_to(cwd / "repo" / ".git")
    before = contents(cwd)
    assert train(cwd, f"train.output_dir={cwd / 'repo' / '.git' / 'runs'}") == 2
    assert train(cwd, f"train.output_dir={cwd / 'link' / 'runs'}") == 2  # through a symlink
    assert report_cli(["--experiment", "x", "--out", str(cwd / "repo" / ".git" / "r.pdf")]) == 2
    err = capsys.readouterr().err
    assert err.count(f"lies inside the git directory {cwd / 'repo' / '.git'}") == 3
    assert "train.output_dir: " in err and "--out: " in err and "choose a folder outside it" in err
    assert contents(cwd) == before


def test_a_report_not_named_pdf_is_refused(cwd, capsys):
    assert report_cli(["--experiment", "x", "--out", "report.txt"]) == 2
    assert "--out report.txt: the report is a PDF; name it *.pdf, e.g. --out report.pdf" in capsys.readouterr().err
    assert contents(cwd) == []


def test_warmstart_refuses_a_cache_inside_git_and_a_missing_data_file(cwd, capsys):
    subprocess.run(["git", "init", "-q", str(cwd / "repo")], check=True)
    before = contents(cwd)
    assert cli(["warmstart", "--set", f"policy.cache_dir={cwd / 'repo' / '.git' / 'cache'}", "--set", "warmstart.envs=[math]",
                "--set", "env.math.source=file", "--set", f"env.math.path={cwd / 'none.jsonl'}"]) == 2
    err = capsys.readouterr().err
    assert "ragen2 warmstart: cannot start:" in err and "policy.cache_dir: " in err and "lies inside the git directory" in err
    assert f"env.math: problem file not found: {cwd / 'none.jsonl'}" in err
    assert contents(cwd) == before


def test_a_bare_repository_counts_as_a_git_directory(tmp_path):
    subprocess.run(["git", "init", "-q", "--bare", str(tmp_path / "bare.git")], check=True)
    [problem] = outputs.output_problems(tmp_path / "bare.git" / "x", "train.output_dir")
    assert "lies inside the git directory" in problem
    assert outputs.output_problems(tmp_path / "runs" / "x", "train.output_dir") == []


def test_a_sweep_storage_inside_git_is_refused(cwd, capsys):
    subprocess.run(["git", "init", "-q", str(cwd / "repo")], check=True)
    path = spec_file(cwd, "seeds: 2\n", storage="repo/.git/sweeps")
    before = contents(cwd)
    assert sweep([str(path)]) == 2
    err = capsys.readouterr().err
    assert f"storage: '{cwd / 'repo' / '.git' / 'sweeps' / 't'}' lies inside the git directory" in err
    assert contents(cwd) == before


# ---------------------------------------------------------------------------- data files

@pytest.mark.parametrize("env", ["math", "code"])
def test_a_data_file_over_the_cap_is_refused_without_reading_it(env, cwd, capsys):
    big = cwd / "big.jsonl"
    with big.open("wb") as f:
        f.truncate(3 << 30)  # 3 GiB, sparse: nothing is written
    t0 = time.monotonic()
    assert train(cwd, f"env.name={env}", f"env.{env}.source=file", f"env.{env}.path={big}") == 2
    err = capsys.readouterr().err
    assert f"env.{env}: {big}: 3,072 MiB, over the 1,024 MiB cap on a data file" in err
    assert "RAGEN2_MAX_DATA_MB" in err and time.monotonic() - t0 < 60
    assert contents(cwd) == ["big.jsonl"]


def test_the_data_cap_can_be_raised_and_files_stream(tmp_path, monkeypatch):
    from ragen2_core.envs.math import read_rows

    rows = [{"query": "q" * 100, "response": f"The answer is: {i}"} for i in range(12000)]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert path.stat().st_size > 1 << 20
    monkeypatch.setenv("RAGEN2_MAX_DATA_MB", "1")
    with pytest.raises(ValueError, match=r"over the 1 MiB cap .* RAGEN2_MAX_DATA_MB=N"):
        read_rows(str(path))
    monkeypatch.setenv("RAGEN2_MAX_DATA_MB", "2")
    assert read_rows(str(path)) == rows


def test_data_files_parse_as_list_lines_or_one_object(tmp_path):
    from ragen2_core.envs.math import read_rows

    cases = {"list.json": '[{"a": 1},\n {"a": 2}]', "lines.jsonl": '{"a": 1}\n\n{"a": 2}\n',
             "one.json": '{\n  "a": 1\n}\n'}
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
    assert [read_rows(str(tmp_path / n)) for n in cases] == [[{"a": 1}, {"a": 2}], [{"a": 1}, {"a": 2}], [{"a": 1}]]
    (tmp_path / "bad.jsonl").write_text('{"a": 1}\n{"a": 2}\n{"a": \n')
    with pytest.raises(ValueError, match=r"bad.jsonl: neither a JSON list nor JSONL \(line 3"):
        read_rows(str(tmp_path / "bad.jsonl"))


def test_mi_refuses_a_rollouts_file_over_the_cap(tmp_path, capsys, monkeypatch):
    path = tmp_path / "rollouts.jsonl"
    with path.open("wb") as f:
        f.truncate(2 << 20)
    monkeypatch.setenv("RAGEN2_MAX_DATA_MB", "1")
    assert mi(["--rollouts", str(path), "--model", "unused"]) == 2
    assert f"{path}: 2 MiB, over the 1 MiB cap on a data file" in capsys.readouterr().err


# ---------------------------------------------------------------------------- ragen2 ui

def test_ui_refuses_a_port_out_of_range_before_anything(cwd, capsys):
    with pytest.raises(SystemExit) as exit_:
        ui(["--port", "70000"])
    assert exit_.value.code == 2
    assert "argument --port: '70000' is not a TCP port; give 1-65535" in capsys.readouterr().err
    assert contents(cwd) == []


def test_ui_without_a_store_creates_none(cwd, capsys):
    assert ui(["--experiment", "no_such_sweep"]) == 2
    assert ui([]) == 2
    err = capsys.readouterr().err
    assert err.count(f"no MLflow store at {cwd / 'mlflow.db'}") == 2 and "--tracking-uri" in err
    assert contents(cwd) == []


def test_ui_refuses_a_port_that_is_taken(tmp_path, capsys):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    MlflowClient(uri).search_experiments()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        assert ui(["--tracking-uri", uri, "--port", str(port)]) == 2
    assert f"--port: port {port} on 127.0.0.1 is taken" in capsys.readouterr().err


# ---------------------------------------------------------------------------- sweep expansion

def spec_file(where: Path, body: str, storage: str | None = None) -> Path:
    path = where / "spec.yaml"
    path.write_text(f"name: t\nbase: {BASE}\nstorage: {storage or where / 'runs'}\n" + body)
    return path


HUGE = "axes:\n" + "".join(f"  {k}: {list(range(1, 1001))}\n" for k in ("train.steps", "rollout.top_k", "train.eval_every"))


@pytest.mark.timeout(60)
def test_a_sweep_of_a_billion_trials_is_counted_not_built(cwd, capsys):
    path = spec_file(cwd, HUGE)
    t0 = time.monotonic()
    with pytest.raises(SpecError) as info:
        load_spec(path)
    [msg] = info.value.errors
    assert "expands to 1,000,000,000 trials" in msg and "over the cap of 1,000" in msg
    assert "axes.train.steps 1,000" in msg and "--max-trials 1000000000" in msg
    assert sweep([str(path)]) == 2
    assert "expands to 1,000,000,000 trials" in capsys.readouterr().err
    assert time.monotonic() - t0 < 10 and contents(cwd) == ["spec.yaml"]


@pytest.mark.timeout(60)
def test_a_dry_run_of_any_size_prints_the_count_and_the_first_trials(cwd, capsys):
    path = spec_file(cwd, HUGE)
    t0 = time.monotonic()
    assert sweep([str(path), "--dry-run"]) == 2  # a real run would be refused: said, with the override
    out, err = capsys.readouterr()
    assert time.monotonic() - t0 < 10
    assert "t: 1,000,000,000 trials" in out and "... and 999,999,980 more" in out
    assert len([line for line in out.splitlines() if line.startswith("base-")]) == 20
    assert "--max-trials 1000000000" in err
    assert contents(cwd) == ["spec.yaml"]


def test_the_cap_can_be_raised(cwd, capsys):
    path = spec_file(cwd, "axes:\n  algo.kl_coef: [0.0, 0.1]\nseeds: 3\n")
    with pytest.raises(SpecError, match=r"expands to 6 trials .* over the cap of 5"):
        load_spec(path, max_trials=5)
    assert len(load_spec(path, max_trials=6)[1]) == 6
    assert sweep([str(path), "--dry-run", "--max-trials", "6"]) == 0
    assert "t: 6 trials" in capsys.readouterr().out


def test_the_count_is_the_product_and_iteration_is_the_expansion(tmp_path):
    path = spec_file(tmp_path, "arms: {a: nofilter, b: paper}\naxes:\n  algo.kl_coef: [0.0, 0.1, 0.2]\n"
                               "zip:\n  - {env.slip: [0.0, 0.1], train.steps: [3, 4]}\n"
                               "search: {kind: random, samples: 2, seed: 1, space: {algo.entropy_coef: {uniform: [0, 0.01]}}}\n"
                               "seeds: 2\n")
    spec, trials = load_spec(path)
    assert count_trials(spec) == len(trials) == 2 * 3 * 2 * 2 * 2
    assert [t.trial_id for t in iter_trials(spec)] == [t.trial_id for t in expand(spec)] == [t.trial_id for t in trials]


def test_every_trial_config_passes_the_preflight_before_the_sweep_starts(cwd, capsys):
    path = spec_file(cwd, "axes:\n  rollout.n_groups: [8, 1000000000]\nseeds: 2\n")
    assert sweep([str(path)]) == 2
    err = capsys.readouterr().err
    assert "sweep: cannot start:" in err and "1000000000 x 8 = 8,000,000,000 rows" in err
    assert "(in 2 of 4 trials, e.g. base rollout.n_groups=1000000000 seed=0)" in err
    assert contents(cwd) == ["spec.yaml"]


def test_good_inputs_pass_every_check(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert pf.preflight(load_config(BASE, [f"train.output_dir={tmp_path / 'runs' / 'x'}"])) == []
    spec, trials = load_spec(spec_file(tmp_path, "arms: {a: nofilter, b: paper}\nseeds: 2\n"))
    from ragen2_core.sweep.trials import sweep_preflight
    assert sweep_preflight(spec, trials) == []
    assert contents(tmp_path) == ["spec.yaml"]
