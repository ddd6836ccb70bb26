"""reports/study.py on the made-up fixture sweep (TEST DATA, see sweep_fixture.py)."""
import importlib.util
from pathlib import Path

import pytest

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
    assert cells[5] == "0.500 → 0.500"  # kept fraction, first and last quarter
    assert cells[6].startswith("0.938 [") and cells[9].startswith("0.000")  # 7, 8: the z-score EMAs
    # MI rises with success in the fixture, entropy falls with it
    mi = next(line for line in out.splitlines() if line.startswith("| `collapse/mi` |"))
    ent = next(line for line in out.splitlines() if line.startswith("| `actor/entropy` |"))
    assert float(mi.split("|")[2].split()[0]) > 0.8 and float(ent.split("|")[2].split()[0]) < -0.8


def test_comparisons_within_a_sweep(tmp_path, capsys):
    uri = write_sweep(tmp_path)
    assert load_study().main(["--tracking-uri", uri, EXPERIMENT]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if "| filter vs nofilter (algo.kl_coef=0) |" in line)
    cells = [c.strip() for c in row.strip("|").split("|")]
    # success: filter 0.5, 0.6, 0.7 vs nofilter 0.2, 0.3, 0.4 -> +30.0 points; pooled SD 0.1, so the
    # t-corrected MDE at 3 vs 3 (df 4) is (2.776 + 0.941) * 0.1 * sqrt(2/3) = 0.3035 -> 30.4 points
    assert cells[2] == "3 vs 3" and cells[3].startswith("30.0 [") and cells[5] == "30.4"
    # late MI = the last of 4 readings = mi: filter mean 1.0 vs nofilter 0.2 -> +0.8; entropy
    # 1 - final/2: 0.7 vs 0.85 -> -0.15; kept fraction 0.5 vs 1 -> -0.5 (every seed: zero width)
    assert cells[6].startswith("0.800 [") and cells[7].startswith("-0.150 [") and cells[8] == "-0.500 [-0.500, -0.500]"
    assert cells[9] == "–"  # the fixture logs no eval/template_frac
    kept = next(line for line in out.splitlines() if line.startswith("| filter | algo.kl_coef=0 |"))
    assert "| 0.500 → 0.500 |" in kept


def test_comparisons_against_a_reference_sweep(tmp_path):
    import copy
    from ragen2_core.report.collect import collect
    study = load_study()
    sweep = collect(write_sweep(tmp_path), EXPERIMENT)
    ref = copy.deepcopy(sweep)  # the default cells: kl 0 only, as a sweep of its own
    ref.experiment = "defaults"
    ref.trials = [t for t in ref.trials if t.condition == "algo.kl_coef=0"]
    ref.expected = [e for e in ref.expected if e["condition"] == "algo.kl_coef=0"]
    for t in ref.trials:
        t.condition = "all"
    ref.expected = [e | {"condition": "all"} for e in ref.expected]
    rows = study.comparison_rows([ref, sweep], ref)
    row = next(r for r in rows if "nofilter (algo.kl_coef=0.01) vs nofilter of defaults" in r)
    # nofilter at kl 0.01 (0.25 every seed) against the reference's nofilter (0.2, 0.3, 0.4): -5.0 points
    assert row.split("|")[4].strip().startswith("-5.0 [")
    # every cell of the swept sweep is compared with the reference's cell of its arm; the reference
    # with itself only arm against baseline
    assert sum("of defaults" in r for r in rows) == 4 and sum(r.startswith("| defaults |") for r in rows) == 1
    two = copy.deepcopy(sweep)
    with pytest.raises(ValueError, match="2 conditions"):
        study.comparison_rows([two], two)
