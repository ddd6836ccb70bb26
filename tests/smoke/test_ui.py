"""`ragen2 ui` serves the store on loopback, prints the runs page, and leaves nothing behind."""
import signal
import socket
import subprocess
import sys
import time
import urllib.request

from mlflow.tracking import MlflowClient

from ragen2_core.ui import START_TIMEOUT_S


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ui_prints_the_runs_page_and_stops_cleanly(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    exp_id = MlflowClient(uri).create_experiment("demo", artifact_location=str(tmp_path / "art"))
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "ragen2_core.cli", "ui", "--tracking-uri", uri, "--port", str(port),
                             "--experiment", "demo"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = ""
        deadline = time.time() + START_TIMEOUT_S + 60  # the command gives up on its own before this
        while "open:" not in line and time.time() < deadline:
            line = proc.stdout.readline()
        assert f"http://127.0.0.1:{port}/#/experiments/{exp_id}/runs" in line
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10).status == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    time.sleep(1)
    with socket.socket() as s:  # the server is gone: its port is free again
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_ui_unknown_experiment_exits_2(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    MlflowClient(uri).search_experiments()
    proc = subprocess.run([sys.executable, "-m", "ragen2_core.cli", "ui", "--tracking-uri", uri, "--experiment", "nope"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no experiment 'nope'" in proc.stderr and "Default" in proc.stderr
