"""`ragen2 ui`: the MLflow UI on the project's store, bound to loopback, stopped cleanly on Ctrl-C.

    ragen2 ui [--tracking-uri URI] [--port 5000] [--experiment NAME]

MLflow 3 opens an experiment on a GenAI "Overview" page that lists none of our runs; this prints the
direct address of the runs page instead, where a sweep run shows its trial runs folded under it.

A port outside 1-65535 or already taken, a tracking URI MLflow cannot read, a local store that does
not exist (opening it would create an empty one) and an unknown experiment exit with status 2
before anything is started or created.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

START_TIMEOUT_S = 300


def runs_page(port: int, experiment_id: str | None) -> str:
    base = f"http://127.0.0.1:{port}"
    return f"{base}/#/experiments/{experiment_id}/runs" if experiment_id else base


def port_number(text: str) -> int:
    """argparse type of --port: a TCP port, 1-65535."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port; give 1-65535, e.g. --port 5000")
    return port


def port_taken(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: TIME_WAIT does not count
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def _refuse(problem: str) -> int:
    print(f"ui: {problem}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    from ragen2_core.tracking.mlflow_sink import default_tracking_uri
    from ragen2_core.outputs import resolve_tracking, store_problems

    parser = argparse.ArgumentParser(prog="ragen2 ui", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tracking-uri", help="MLflow store (default: $MLFLOW_TRACKING_URI, else ./mlflow.db)")
    parser.add_argument("--port", type=port_number, default=5000, help="loopback port (default 5000, MLflow's own)")
    parser.add_argument("--experiment", help="print the runs page of this experiment (e.g. a sweep name)")
    args = parser.parse_args(argv)
    uri = args.tracking_uri or default_tracking_uri()
    # Before MLflow opens the store: opening a missing one creates it.
    problems = store_problems(uri, "--tracking-uri" if args.tracking_uri else resolve_tracking(None)[1])
    if problems:
        return _refuse(problems[0])
    experiment_id = None
    if args.experiment:
        from mlflow.tracking import MlflowClient
        exp = MlflowClient(uri).get_experiment_by_name(args.experiment)
        if exp is None:
            names = [e.name for e in MlflowClient(uri).search_experiments()]
            return _refuse(f"no experiment {args.experiment!r} at {uri}; experiments there: {', '.join(names)}")
        experiment_id = exp.experiment_id
    if port_taken(args.port):
        return _refuse(f"--port: port {args.port} on 127.0.0.1 is taken (another server, or an earlier "
                       f"`ragen2 ui`); pass a free one, e.g. --port {args.port % 65535 + 1}")
    # SIGTERM (e.g. from a supervisor) ends this process through the same clean-up as Ctrl-C.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    # Its own process group, so Ctrl-C here stops the server and its workers, and nothing lingers.
    proc = subprocess.Popen([sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
                             "--host", "127.0.0.1", "--port", str(args.port)], start_new_session=True)
    try:
        # Wait until it answers before printing an address: on a busy machine its workers take minutes.
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                print(f"ui: mlflow ui exited with status {proc.returncode} before answering on port "
                      f"{args.port}; its messages are above", file=sys.stderr)
                return 1
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{args.port}/health", timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline:
                    print(f"ui: mlflow ui did not answer on port {args.port} within {START_TIMEOUT_S} s; "
                          "stopped it (a loaded machine? try again)", file=sys.stderr)
                    return 1
                time.sleep(0.5)
        print(f"MLflow UI for {uri}\n  open: {runs_page(args.port, experiment_id)}\n  Ctrl-C stops it", flush=True)
        proc.wait()
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
    return 0
