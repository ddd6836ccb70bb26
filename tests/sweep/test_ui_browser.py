"""The MLflow UI as a user sees it (slow tier): on a real sweep's store, `ragen2 ui` prints the runs
page, which lists the sweep run with its trial runs, and a trial's page draws metric charts.
Needs Debian's chromium (/usr/bin/chromium) and the playwright package; skipped without them."""
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
from mlflow.tracking import MlflowClient

from test_sweep_e2e import sweep, write_spec

playwright = pytest.importorskip("playwright.sync_api")
CHROMIUM = shutil.which("chromium")
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(CHROMIUM is None, reason="no chromium (apt-get install chromium)")]
# Headless flags for this closed network (background services would be refused by the firewall).
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_runs_page_nests_trials_under_the_sweep_and_draws_charts(tmp_path):
    spec = write_spec(tmp_path, "uisweep", tmp_path / "cache", arms={"a": {}, "b": {"algo.kl_coef": 0.01}})
    done = sweep(tmp_path, spec, "--no-report")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("uisweep")
    runs = client.search_runs([exp.experiment_id])
    trials = [r for r in runs if r.data.tags.get("ragen2.role") == "trial"]
    port = free_port()
    ui = subprocess.Popen([sys.executable, "-m", "ragen2_core.cli", "ui", "--tracking-uri", uri, "--port", str(port),
                           "--experiment", "uisweep"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line, deadline = "", time.time() + 120
        while "open:" not in line and time.time() < deadline:
            line = ui.stdout.readline()
        url = line.split("open:")[1].strip()
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.goto(url)
            sweep_link = page.get_by_role("link", name="uisweep", exact=True).first
            sweep_link.wait_for(timeout=60000)
            page.get_by_text(f"{len(runs)} matching runs").first.wait_for(timeout=60000)
            # only the sweep run at top level: its trials are folded under it ...
            assert trials[0].info.run_name not in page.inner_text("body")
            # ... and its row's expander lists them, after it
            page.locator("[role=gridcell]", has=sweep_link).first.locator("button").first.click()
            page.get_by_role("link", name=trials[0].info.run_name, exact=True).first.wait_for(timeout=60000)
            text = page.inner_text("body")
            assert all(text.index(t.info.run_name) > text.index("uisweep") for t in trials)
            page.goto(f"{url}/{trials[0].info.run_id}/model-metrics")
            page.get_by_text(f"{trials[0].info.run_name} (actor/pg_loss)").first.wait_for(timeout=60000)
            page.locator(".js-plotly-plot").first.wait_for(timeout=60000)  # a drawn chart, not only its title
            browser.close()
    finally:
        ui.send_signal(signal.SIGTERM)
        ui.wait(timeout=30)
