"""scripts/mechanism_study.sh: what it does without starting a sweep (skipping an archived one,
refusing an unknown one). Starting and resuming are the sweep driver's, tested in tests/sweep."""
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "mechanism_study.sh"


def _run(*sweeps: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *sweeps], capture_output=True, text=True, timeout=120, cwd="/")


def test_an_archived_sweep_is_skipped_and_nothing_starts():
    done = _run("p1_shaped")  # docs/data/mechanism/p1_shaped.json.gz is kept in the repository
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[study] p1_shaped: archived in docs/data/mechanism/p1_shaped.json.gz, skipped"


def test_an_unknown_sweep_is_refused_before_any_runs():
    done = _run("p1_shaped", "no_such_sweep")
    assert done.returncode == 2
    assert done.stdout == ""  # not even the archived sweep before it was looked at
    assert "no sweep 'no_such_sweep' (ablations/mechanism/no_such_sweep.yaml does not exist)" in done.stderr
