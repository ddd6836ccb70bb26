"""ragen2 study on the made-up fixture sweep (TEST DATA, see sweep_fixture.py)."""
import pytest

from ragen2_core.report import study
from sweep_fixture import EXPERIMENT, write_sweep


def test_cell_changes_and_pooled_rho(tmp_path, capsys):
    uri = write_sweep(tmp_path)
    assert study.main(["--tracking-uri", uri, EXPERIMENT]) == 0
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
    assert study.main(["--tracking-uri", uri, EXPERIMENT]) == 0
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
    # every cell of the swept sweep is compared with the reference's cell of its arm, but for its kl 0
    # cells, which are the reference's own runs (a cell against itself says nothing); the reference
    # with itself only arm against baseline
    assert sum("of defaults" in r for r in rows) == 2 and sum(r.startswith("| defaults |") for r in rows) == 1
    assert not any("(algo.kl_coef=0) vs" in r for r in rows if "of defaults" in r)
    two = copy.deepcopy(sweep)
    with pytest.raises(ValueError, match="2 conditions"):
        study.comparison_rows([two], two)


def test_centred_removes_what_differs_between_cells():
    # Cell A: x 1, 2, 3 with y 0.25, 0.5, 0.75 (y rises with x); cell B: x 11, 12, 13 with
    # y 1.0, 0.75, 0.5 (y falls with x). Centred: A x -1, 0, 1 / y -0.25, 0, 0.25; B x -1, 0, 1 /
    # y 0.25, 0, -0.25. Ranks of centred x: 1.5 3.5 5.5 1.5 3.5 5.5; of centred y: 1.5 3.5 5.5 5.5
    # 3.5 1.5; deviations from 3.5: (-2 0 2 -2 0 2) . (-2 0 2 2 0 -2) = 4 + 4 - 4 - 4 = 0, so rho 0.
    # Pooled instead: x ranks 1..6, y ranks 1 2.5 4.5 6 4.5 2.5; deviations (-2.5 -1.5 -.5 .5 1.5 2.5)
    # and (-2.5 -1 1 2.5 1 -1): products sum to 7.5, squares to 17.5 and 16.5, rho = 7.5 /
    # sqrt(17.5 * 16.5) = 0.4414: the cells' levels alone make x look predictive.
    from ragen2_core.report import stats
    pts = [("A", 1, 0.25), ("A", 2, 0.5), ("A", 3, 0.75), ("B", 11, 1.0), ("B", 12, 0.75), ("B", 13, 0.5),
           ("C", 5, 0.9)]  # a cell of one trial has no within-cell spread: left out
    x, y = study.centred(pts)
    assert x == [-1, 0, 1, -1, 0, 1] and y == [-0.25, 0, 0.25, 0.25, 0, -0.25]
    assert stats.spearman_ci(x, y)["rho"] == pytest.approx(0.0, abs=1e-12)
    pooled = stats.spearman_ci([p[1] for p in pts[:6]], [p[2] for p in pts[:6]])
    assert pooled["rho"] == pytest.approx(7.5 / (17.5 * 16.5) ** 0.5)


def test_within_cell_column_in_the_table(tmp_path, capsys):
    uri = write_sweep(tmp_path)
    assert study.main(["--tracking-uri", uri, EXPERIMENT]) == 0
    out = capsys.readouterr().out
    assert "| within cells: rho [95% CI] |" in out
    # in the fixture MI rises with success inside each cell too (mi and success both grow with the
    # seed's index), so the within-cell rho of MI is positive, not the dash of an undefined one
    mi = next(line for line in out.splitlines() if line.startswith("| `collapse/mi` |"))
    assert float(mi.split("|")[4].split()[0]) > 0.5


def test_effect_against_the_reference_effect(tmp_path, capsys):
    import copy
    from ragen2_core.report import archive
    from ragen2_core.report.collect import collect
    sweep = collect(write_sweep(tmp_path), EXPERIMENT)
    ref = copy.deepcopy(sweep)  # the kl 0 cells as a reference sweep of their own, as above
    ref.experiment = "defaults"
    ref.trials = [t for t in ref.trials if t.condition == "algo.kl_coef=0"]
    for t in ref.trials:
        t.condition = "all"
    ref.expected = [e | {"condition": "all"} for e in ref.expected if e["condition"] == "algo.kl_coef=0"]
    ref.spec["axes"] = {}
    paths = [archive.save(s, tmp_path / f"{s.experiment}{archive.SUFFIX}") for s in (ref, sweep)]
    assert study.main(["--reference", "defaults", *map(str, paths)]) == 0
    out = capsys.readouterr().out
    head = "### each arm's effect against its effect in defaults"
    assert head in out
    section = out.split(head)[1].split("###")[0].splitlines()
    row = next(line for line in section
               if line.startswith(f"| {EXPERIMENT} | filter vs nofilter (algo.kl_coef=0.01) |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    # filter's effect at kl 0.01: 0.55 - 0.25 = 0.30; in the reference: 0.6 - 0.3 = 0.30 -> 0.0 points.
    # Pooled SD over the four cells: squares about each cell's mean 0.065 (0.4, 0.5, 0.75), 0,
    # 0.02, 0.02 -> sqrt(0.105 / (12 - 4)) = 0.11456; MDE on 8 df: (2.3060 + 0.8889) * 0.11456 *
    # sqrt(4 / 3) = 0.4227 -> 42.3 points
    assert cells[3] == "3 + 3 + 3 + 3" and cells[4].startswith("0.0 [") and cells[5] == "42.3"
    # the kl 0 cells are the reference's own runs: their effect minus itself is no comparison
    assert not any(line.startswith(f"| {EXPERIMENT} | filter vs nofilter (algo.kl_coef=0) |") for line in section)


def test_a_sweep_holding_its_default_cells_is_its_own_reference(tmp_path, capsys):
    """--reference-condition: the kl 0 cells of the fixture itself, with no copy made by hand, give
    the numbers derived above and draw the axis figure."""
    uri = write_sweep(tmp_path)
    figs = tmp_path / "figs"
    assert study.main(["--tracking-uri", uri, "--reference", EXPERIMENT, "--reference-condition", "algo.kl_coef=0",
                       "--figures", str(figs), EXPERIMENT]) == 0
    out = capsys.readouterr().out
    reference = f"{EXPERIMENT} at algo.kl_coef=0"
    section = out.split(f"### each arm's effect against its effect in {reference}")[1].split("###")[0]
    rows = [line for line in section.splitlines() if line.startswith(f"| {EXPERIMENT} |")]
    assert len(rows) == 1 and "| filter vs nofilter (algo.kl_coef=0.01) |" in rows[0]
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[3] == "3 + 3 + 3 + 3" and cells[4].startswith("0.0 [") and cells[5] == "42.3"
    # the condition's effect per arm: nofilter 0.25 vs 0.3 at kl 0 -> -5.0 points
    row = next(line for line in out.splitlines() if f"| nofilter (algo.kl_coef=0.01) vs nofilter of {reference} |" in line)
    assert row.split("|")[4].strip().startswith("-5.0 [")
    assert not any(f"(algo.kl_coef=0) vs filter of {reference}" in line for line in out.splitlines())
    assert [p.name for p in figs.iterdir()] == [f"{EXPERIMENT}-algo.kl_coef.png"]
    # drawn from the sweep and the reference cut from it, each trial once: 3 seeds at each value
    from ragen2_core.report.collect import collect
    sweep = collect(uri, EXPERIMENT)
    effects = study.axis_effects(sweep, study.reference_cells(sweep, "algo.kl_coef=0"), "algo.kl_coef")
    assert {x: len(v) for x, v in effects["arms"]["filter"]["finals"].items()} == {0.0: 3, 0.01: 3}
    assert [round(e.value, 6) for e in effects["arms"]["filter"]["effect"]] == [0.3, 0.3]


def test_a_reference_condition_the_sweep_lacks_is_named(tmp_path, capsys):
    uri = write_sweep(tmp_path)
    assert study.main(["--tracking-uri", uri, "--reference", EXPERIMENT, "--reference-condition", "algo.kl_coef=0.5",
                       EXPERIMENT]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert ("--reference-condition 'algo.kl_coef=0.5': fixture_kl_vs_filter has no such condition; its conditions: "
            "algo.kl_coef=0, algo.kl_coef=0.01") in captured.err
    with pytest.raises(SystemExit) as e:
        study.main(["--reference-condition", "algo.kl_coef=0", EXPERIMENT])
    assert e.value.code == 2 and "name that sweep too" in capsys.readouterr().err


def test_success_and_effect_against_an_axis(tmp_path, capsys):
    import copy
    from ragen2_core.report.collect import collect
    sweep = collect(write_sweep(tmp_path), EXPERIMENT)
    ref = copy.deepcopy(sweep)
    ref.experiment = "defaults"
    ref.trials = [t for t in ref.trials if t.condition == "algo.kl_coef=0"]
    sweep.trials = [t for t in sweep.trials if t.condition != "algo.kl_coef=0"]  # the swept value only
    effects = study.axis_effects(sweep, ref, "algo.kl_coef")
    # the reference's cells join at kl 0: filter 0.6 then 0.55 at kl 0.01, nofilter 0.3 then 0.25;
    # the filter's effect 0.30 at both
    assert effects["reference_x"] == 0.0
    f, nf = effects["arms"]["filter"], effects["arms"]["nofilter"]
    assert f["x"] == [0.0, 0.01] and [round(e.value, 6) for e in f["success"]] == [0.6, 0.55]
    assert [round(e.value, 6) for e in nf["success"]] == [0.3, 0.25] and nf["effect"] is None
    assert [round(e.value, 6) for e in f["effect"]] == [0.3, 0.3]
    # a second axis would pool its cells: nothing drawn; nor for a string-valued axis
    two = copy.deepcopy(sweep)
    two.axes = ["algo.kl_coef", "env.slip"]
    assert study.axis_effects(two, ref, "algo.kl_coef") is None
    for t in sweep.trials:
        t.params["algo.kl_coef"] = "high"
    assert study.axis_effects(sweep, ref, "algo.kl_coef") is None
    from PIL import Image
    path = study.draw_axis(effects, "test", tmp_path / "figs" / "fixture-algo.kl_coef.png")
    assert Image.open(path).size == (800, 320)
    # --figures needs a reference: a usage error, nothing drawn
    with pytest.raises(SystemExit) as e:
        study.main(["--figures", str(tmp_path / "none"), EXPERIMENT])
    assert e.value.code == 2 and not (tmp_path / "none").exists() and "--reference" in capsys.readouterr().err
