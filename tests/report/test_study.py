"""reports/study.py on the made-up fixture sweep (TEST DATA, see sweep_fixture.py)."""
import importlib.util
from pathlib import Path

from sweep_fixture import EXPERIMENT, write_sweep

ROOT = Path(__file__).resolve().parents[2]


def load_study():
    spec = importlib.util.spec_from_file_location("study", ROOT / "reports" / "study.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cell_changes_and_pooled_rho(tmp_path, capsys):
    uri = write_sweep(tmp_path)
    assert load_study().main(["--tracking-uri", uri, EXPERIMENT]) == 0
    out = capsys.readouterr().out
    # filter kl=0: finals 0.5, 0.6, 0.7; MI logged as mi * step / 16 at steps 1..16, so each trial's
    # change (last quarter minus first quarter: one reading each) is 15/16 of its last MI (0.9, 1.0,
    # 1.1): mean 0.9375; entropy is constant: change 0.
    row = next(line for line in out.splitlines() if line.startswith("| filter | algo.kl_coef=0 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == "3" and cells[3].startswith("0.600 [")
    assert cells[4] == "–"  # the fixture logs no eval/template_frac
    assert cells[5].startswith("0.938 [") and cells[8].startswith("0.000")  # 6, 7: the z-score EMAs
    # MI rises with success in the fixture, entropy falls with it
    mi = next(line for line in out.splitlines() if line.startswith("| `collapse/mi` |"))
    ent = next(line for line in out.splitlines() if line.startswith("| `actor/entropy` |"))
    assert float(mi.split("|")[2].split()[0]) > 0.8 and float(ent.split("|")[2].split()[0]) < -0.8
