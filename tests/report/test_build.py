"""End to end: a made-up sweep in a real sqlite MLflow store -> PDF, CSV, JSON (see conftest.py)."""
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as sps

from sweep_fixture import EXPERIMENT, FINAL, write_sweep
from ragen2_core.report.build import build, main

PAGES = 18  # title, table, 8 curve metrics, filter, 1 dose axis, comparison, predictors, examples, monitors, cost,
#              robust
ROOT = Path(__file__).resolve().parents[2]


def pdf_text(path: Path) -> tuple[int, str]:
    pypdf = pytest.importorskip("pypdf")
    reader = pypdf.PdfReader(str(path))
    return len(reader.pages), "\n".join(p.extract_text() for p in reader.pages)


def percentile_ci(values):
    """What the table should hold for 3 seeds, computed here straight from scipy."""
    res = sps.bootstrap((np.asarray(values),), np.mean, method="percentile", n_resamples=2000,
                        rng=np.random.default_rng(0), vectorized=True)
    return res.confidence_interval.low, res.confidence_interval.high


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    uri = write_sweep(root)
    pdf, summary = build(uri, EXPERIMENT, root / "out" / "report.pdf")
    return uri, pdf, summary


def test_main_table_matches_hand_values(full):
    _, pdf, summary = full
    rows = {(r["arm"], r["condition"]): r for r in summary["table"]}
    assert len(rows) == 4
    for (arm, kl), finals in FINAL.items():
        r = rows[(arm, f"algo.kl_coef={kl:.4g}")]
        assert r["n"] == 3 and r["n_text"] == "3" and not r["inconclusive"]
        # the re-reported step 20 (value 0.0, older write) must not replace the final value
        assert r["success_value"] == pytest.approx(np.mean(finals))
        if len(set(finals)) == 1:
            assert (r["success_low"], r["success_high"]) == (finals[0], finals[0])
            assert r["success_method"].startswith("all equal")
        else:
            assert (r["success_low"], r["success_high"]) == pytest.approx(percentile_ci(finals))
            assert r["success_method"] == "percentile bootstrap"
    best = [k for k, r in rows.items() if r["best"]]
    assert best == [("filter", "algo.kl_coef=0")]                       # mean 0.6
    assert rows[("filter", "algo.kl_coef=0")]["success_iqm"] == pytest.approx(0.6)
    # side metrics: last collapse/mi = MI at step 16 of each seed: filter kl=0 -> mean(0.9, 1.0, 1.1)
    assert rows[("filter", "algo.kl_coef=0")]["collapse/mi:value"] == pytest.approx(1.0)
    assert rows[("nofilter", "algo.kl_coef=0")]["filter/kept_ratio:value"] == pytest.approx(1.0)


def test_files_beside_the_pdf(full):
    _, pdf, summary = full
    assert pdf.exists() and summary["pages"] == PAGES
    on_disk = json.loads(pdf.with_suffix(".json").read_text())
    assert on_disk["table"] == summary["table"]
    for name in ("table", "comparisons", "predictors", "cost", "trials"):
        text = (pdf.parent / f"report.{name}.csv").read_text()
        assert text.strip() and "nan" not in text.lower()


def test_comparisons_and_predictors(full):
    _, _, summary = full
    cmp = {r["condition"]: r for r in summary["comparisons"]}
    # filter - nofilter at kl 0: 0.6 - 0.3; 3 vs 3 seeds with no ties across arms -> exact p = 2/20
    assert cmp["algo.kl_coef=0"]["diff_value"] == pytest.approx(0.3)
    assert cmp["algo.kl_coef=0"]["p"] == pytest.approx(0.1)
    assert cmp["algo.kl_coef=0"]["p_holm"] == pytest.approx(0.2)       # two cells, both p = 0.1
    assert "no evidence" in cmp["algo.kl_coef=0"]["verdict"]
    pred = {r["predictor"]: r for r in summary["predictors"]}
    assert pred["collapse/mi"]["rho"] > 0.8 and pred["actor/entropy"]["rho"] < -0.8
    poi = summary["probability_of_improvement"][0]
    assert poi["arm"] == "filter" and poi["poi_value"] == pytest.approx(1.0)  # every filter run beats every nofilter run


def test_pdf_pages_and_text(full):
    _, pdf, _ = full
    pages, text = pdf_text(pdf)
    assert pages == PAGES
    for needle in ("nofilter", "filter", "0.600", "0.300", "algo.kl_coef=0.01", "does a KL penalty replace",
                   "I will move towards the goal", "n=3"):
        assert needle in text, needle
    assert not re.search(r"\bnan\b", text, re.I)


def test_partial_sweep_flags_n(tmp_path):
    uri = write_sweep(tmp_path, failed=("filter", 0.01, 2))
    pdf, summary = build(uri, EXPERIMENT, tmp_path / "partial.pdf")
    r = next(r for r in summary["table"] if r["arm"] == "filter" and r["condition"] == "algo.kl_coef=0.01")
    assert (r["n"], r["failed"], r["inconclusive"]) == (2, 1, True)
    assert r["n_text"] == "2 of 3 (1 failed)"
    assert r["success_value"] == pytest.approx(np.mean([0.4, 0.5]))    # the failed seed is out, and said so
    pages, text = pdf_text(pdf)
    assert pages == PAGES and "2 of 3 (1 failed)" in text and "inconclusive" in text


def test_unknown_experiment_lists_what_exists(full, tmp_path, capsys):
    uri, _, _ = full
    assert main(["--experiment", "no_such_sweep", "--tracking-uri", uri, "--out", str(tmp_path / "x.pdf")]) == 2
    err = capsys.readouterr().err
    assert "no_such_sweep" in err and EXPERIMENT in err
    assert not (tmp_path / "x.pdf").exists()


def test_script_entry_point(full, tmp_path):
    uri, _, _ = full
    done = subprocess.run([sys.executable, str(ROOT / "reports" / "build.py"), "--experiment", "nope",
                           "--tracking-uri", uri], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and EXPERIMENT in done.stderr


def test_png_pages_for_documents(tmp_path):
    uri = write_sweep(tmp_path)
    build(uri, EXPERIMENT, tmp_path / "r.pdf", png_dir=tmp_path / "png")
    pngs = sorted((tmp_path / "png").glob("*.png"))
    assert [p.name for p in pngs] == [f"{EXPERIMENT}-p{i:02d}.png" for i in range(1, PAGES + 1)]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    assert not list((tmp_path / "png").glob(".tmp-*"))
