"""Bad input a careless user gives: a clear error naming the file, field or value and the fix,
exit status 2, in seconds, and nothing left behind (no store, run, directory or stray file)."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ragen2_core.atomic import write_text_atomic
from ragen2_core.cli import main as cli
from ragen2_core.config import ConfigError, load_config
from ragen2_core.mi_offline import main as mi
from ragen2_core.report.build import main as report
from ragen2_core.sweep.spec import SpecError, read_spec
from ragen2_core.train.preflight import STALE_LOCK_S, build_lock_problems

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "sweeps" / "base" / "frozenlake_tiny.yaml"
BOMB = "".join(f"{k}: &{k} [{', '.join(['*' + p] * 9 if p else ['x'] * 9)}]\n"
               for p, k in zip(["", "a", "b", "c", "d", "e", "f", "g"], "abcdefgh"))  # 9**8 = 43M leaves


def nothing_left(where: Path) -> list[str]:
    return sorted(p.name for p in where.iterdir())


def spec(tmp_path, body: str) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(f"name: t\nbase: {BASE}\nstorage: {tmp_path / 'runs'}\n" + body)
    return path


# ---------------------------------------------------------------------------- configs

@pytest.mark.parametrize("value", [".inf", "-.inf", "1e999", ".nan"])
def test_non_finite_floats_are_refused_in_files_and_overrides(value, tmp_path):
    with pytest.raises(ConfigError, match=r"algo\.kl_coef: .* is not a finite number"):
        load_config(None, [f"algo.kl_coef={value}"])
    path = tmp_path / "c.yaml"
    path.write_text(f"algo:\n  kl_coef: {value}\n")
    with pytest.raises(ConfigError, match=r"algo\.kl_coef: .* is not a finite number"):
        load_config(path)


def test_an_empty_config_file_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty.yaml").write_text("# nothing yet\n\n")
    assert cli(["train", "--config", "empty.yaml"]) == 2
    err = capsys.readouterr().err
    assert "empty.yaml" in err and "empty" in err and "check the path" in err
    assert nothing_left(tmp_path) == ["empty.yaml"]


@pytest.mark.timeout(30)
def test_an_alias_bomb_is_refused_in_a_config_a_spec_and_an_override(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB)
    with pytest.raises(ConfigError, match="alias bomb"):
        load_config(path)
    with pytest.raises(SpecError, match="alias bomb"):
        read_spec(spec(tmp_path, "fixed:\n  " + BOMB.replace("\n", "\n  ")))
    with pytest.raises(ConfigError, match="alias bomb"):
        load_config(None, ["train.output_dir=" + BOMB.replace("\n", ", ").join("{}")])


def test_oversized_and_non_utf8_files_name_the_file(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("train:\n  steps: 3\n" + "# padding\n" * 200_000)
    with pytest.raises(ConfigError, match="big.yaml: .* over the 1048576-byte limit"):
        load_config(big)
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"train:\n  output_dir: caf\xe9\n")
    with pytest.raises(ConfigError, match=r"latin.yaml:2: not UTF-8 text \(byte 0xe9"):
        load_config(latin)
    bad_spec = spec(tmp_path, "")
    bad_spec.write_bytes(bad_spec.read_bytes() + b"seeds: 2 # \xff\n")
    with pytest.raises(SpecError, match=r"spec.yaml:4: not UTF-8 text"):
        read_spec(bad_spec)


# ---------------------------------------------------------------------------- sweep specs

@pytest.mark.parametrize("seeds", ["1000000", str(list(range(1001)))], ids=["count", "list"])
def test_seeds_are_bounded(seeds, tmp_path):
    with pytest.raises(SpecError, match=r"seeds: .*(out of range|over the limit)"):
        read_spec(spec(tmp_path, f"seeds: {seeds}\n"))


def test_axis_values_that_are_the_same_setting_are_refused(tmp_path):
    with pytest.raises(SpecError, match=r"axes\.algo\.kl_coef: 0 and 0\.0 are the same setting"):
        read_spec(spec(tmp_path, "axes:\n  algo.kl_coef: [0, 0.0]\n"))
    assert read_spec(spec(tmp_path, "axes:\n  algo.kl_coef: [0, 0.01]\n")).axes == {"algo.kl_coef": [0, 0.01]}


# ---------------------------------------------------------------------------- ragen2 train

def test_train_checks_the_env_before_any_side_effect(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    missing = tmp_path / "no_such_data.jsonl"
    code = cli(["train", "--set", "env.name=math", "--set", "env.math.source=file",
                "--set", f"env.math.path={missing}", "--set", f"train.output_dir={tmp_path / 'runs' / 'x'}",
                "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"])
    assert code == 2
    err = capsys.readouterr().err
    assert "env.math" in err and str(missing) in err
    assert nothing_left(tmp_path) == []  # no mlflow.db, no runs/, no mlruns/


def test_a_stale_extension_build_lock_is_named_with_its_fix(tmp_path):
    assert build_lock_problems(tmp_path, wait_s=0) == []
    lock = tmp_path / "py311_cpu" / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    old = time.time() - STALE_LOCK_S - 60
    os.utime(lock, (old, old))
    [problem] = build_lock_problems(tmp_path, wait_s=30)  # stale: reported at once, no waiting
    assert str(lock) in problem and f"rm {lock}" in problem
    os.utime(lock, None)  # fresh: maybe a build running now; waited for, then reported
    [problem] = build_lock_problems(tmp_path, wait_s=0.2)
    assert str(lock) in problem


@pytest.mark.slow  # imports DeepSpeed in a fresh interpreter: about 20 s
def test_a_training_process_leaves_no_process_group_file(tmp_path):
    env = dict(os.environ, TMPDIR=str(tmp_path), DS_ACCELERATOR="cpu", PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", "from ragen2_core.train.engine import init_distributed; "
                           "print(init_distributed())"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "(0, 1)" in done.stdout, done.stderr[-2000:]
    assert [p for p in tmp_path.iterdir() if p.name.startswith("ragen2-pg-")] == []


# ---------------------------------------------------------------------------- files written

@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_atomic_files_honour_the_umask(umask, mode, tmp_path):
    old = os.umask(umask)
    try:
        write_text_atomic(tmp_path / "table.csv", "a,b\n")
        (tmp_path / "plain.csv").write_text("a,b\n")
    finally:
        os.umask(old)
    assert (tmp_path / "table.csv").stat().st_mode & 0o777 == mode == (tmp_path / "plain.csv").stat().st_mode & 0o777


# ---------------------------------------------------------------------------- ragen2 report

def test_report_on_a_missing_store_creates_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "r.pdf"
    assert report(["--experiment", "x", "--out", str(out)]) == 2  # default store: ./mlflow.db
    assert report(["--experiment", "x", "--tracking-uri", str(tmp_path / "mlruns"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "no MLflow store at" in err and "mlflow.db" in err and "--tracking-uri" in err
    assert nothing_left(tmp_path) == []


@pytest.mark.parametrize("content", [b"not a database at all" * 100, b"SQLite format 3\x00" + b"\x00" * 200])
def test_report_on_a_corrupt_store_is_a_clear_error(content, tmp_path, capsys):
    db = tmp_path / "mlflow.db"
    db.write_bytes(content)
    assert report(["--experiment", "x", "--tracking-uri", f"sqlite:///{db}", "--out", str(tmp_path / "r.pdf")]) == 2
    assert str(db) in capsys.readouterr().err
    assert nothing_left(tmp_path) == ["mlflow.db"]


def test_report_on_an_experiment_without_runs_writes_nothing(tmp_path, capsys):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    MlflowClient(uri).create_experiment("idle", artifact_location=str(tmp_path / "mlruns"))
    assert report(["--experiment", "idle", "--tracking-uri", uri, "--out", str(tmp_path / "r.pdf")]) == 2
    assert "has no runs" in capsys.readouterr().err
    assert not (tmp_path / "r.pdf").exists() and not list(tmp_path.glob("r.*"))


# ---------------------------------------------------------------------------- ragen2 mi

def episode(step, group_id=0) -> dict:
    return {"step": step, "group_id": group_id, "env_seed": 0, "episode_reward": 0.0, "success": False,
            "context": "c", "reasoning": "r", "reasonings": ["r"], "responses": ["x"], "context_ids": [1],
            "reasoning_ids": [2]}


@pytest.mark.parametrize("bad, field", [(episode("abc"), "step"), (episode(None), "step"),
                                        (episode(1, group_id=1.5), "group_id")])
def test_mi_names_the_line_of_a_bad_record(bad, field, tmp_path, capsys):
    path = tmp_path / "rollouts.jsonl"
    path.write_text(json.dumps(episode(1)) + "\n\n" + json.dumps(bad) + "\n")
    assert mi(["--rollouts", str(path), "--model", "unused"]) == 2
    err = capsys.readouterr().err
    assert f"{path}:3: {field} is {json.dumps(bad[field])}" in err and "whole number" in err


def test_mi_names_the_line_of_non_utf8_text(tmp_path, capsys):
    path = tmp_path / "rollouts.jsonl"
    path.write_bytes(json.dumps(episode(1)).encode() + b"\n" + json.dumps(episode(1)).encode()[:-1] + b', "x": "\xff"}\n')
    assert mi(["--rollouts", str(path), "--model", "unused"]) == 2
    assert f"{path}:2: not UTF-8 text (byte 0xff" in capsys.readouterr().err


# ---------------------------------------------------------------------------- no bubblewrap

def test_without_bubblewrap_the_code_env_refuses_and_says_how_to_install(tmp_path, monkeypatch, capsys):
    from ragen2_core.envs import sandbox
    from ragen2_core.envs.code import CodeEnv
    from ragen2_core.envs.math import MathEnv
    from ragen2_core.envs.sandbox import host

    host.host_probe()  # probed for real first; then only bwrap goes missing
    monkeypatch.setitem(host._HOST, "bwrap", "")
    monkeypatch.setattr(sandbox, "_PROBLEM", [])
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    with pytest.raises(sandbox.SandboxUnavailable, match="apt-get install -y bubblewrap"):
        CodeEnv()
    MathEnv().reset(0)  # everything else works
    monkeypatch.chdir(tmp_path)
    assert cli(["train", "--set", "env.name=code", "--set", f"train.output_dir={tmp_path / 'runs'}"]) == 2
    assert "apt-get install -y bubblewrap" in capsys.readouterr().err and nothing_left(tmp_path) == []
