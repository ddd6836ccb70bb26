"""One run's curves from its metrics.jsonl: a replayed step keeps its last record; bad input exits 2."""
import math

from ragen2_core.report.run_curves import main, read_curves
from ragen2_core.tracking import JsonlSink


def write_run(folder):
    with JsonlSink(folder / "metrics.jsonl") as sink:
        sink.log_params({"train.steps": 3})
        sink.log_metrics({"rollout/success": 0.1, "collapse/mi": 1.0}, step=1)
        sink.log_metrics({"rollout/success": 0.2}, step=2)
    # a resumed run (checkpoint at step 1) replays step 2 and goes on
    with JsonlSink(folder / "metrics.jsonl") as sink:
        sink.log_metrics({"rollout/success": 0.25, "collapse/mi": float("nan")}, step=2)
        sink.log_metrics({"rollout/success": 0.3}, step=3)


def test_the_last_record_of_a_replayed_step_wins(tmp_path):
    write_run(tmp_path)
    curves = read_curves(tmp_path)
    assert curves["rollout/success"] == ([1, 2, 3], [0.1, 0.25, 0.3])
    steps, mi = curves["collapse/mi"]
    assert steps == [1, 2] and mi[0] == 1.0 and math.isnan(mi[1])


def test_writes_a_figure_and_refuses_what_the_run_never_logged(tmp_path, capsys):
    write_run(tmp_path)
    out = tmp_path / "fig" / "curves.png"
    assert main([str(tmp_path), "--out", str(out), "--metrics", "rollout/success,collapse/mi"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main([str(tmp_path), "--out", str(out), "--metrics", "eval/success"]) == 2
    assert "--metrics eval/success: never logged" in capsys.readouterr().err
    assert main([str(tmp_path / "nope"), "--out", str(out)]) == 2


def test_windows_print_each_metrics_mean_per_step_range(tmp_path, capsys):
    write_run(tmp_path)
    # success: step 1 -> 0.1; steps 2-3 -> (0.25 + 0.3) / 2 = 0.275. MI: 1.0; then only a NaN -> '-'.
    assert main([str(tmp_path), "--windows", "1,2-3", "--metrics", "rollout/success,collapse/mi"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "| metric | steps 1 | steps 2-3 |"
    assert out[2:] == ["| `rollout/success` | 0.100 | 0.275 |", "| `collapse/mi` | 1.000 | - |"]
    assert main([str(tmp_path), "--windows", "3-2", "--metrics", "rollout/success"]) == 2
    assert "'3-2' is not a step or a range" in capsys.readouterr().err


def test_a_gzipped_log_reads_as_the_plain_one(tmp_path):
    import gzip
    write_run(tmp_path)
    packed = tmp_path / "m.jsonl.gz"
    packed.write_bytes(gzip.compress((tmp_path / "metrics.jsonl").read_bytes()))
    assert read_curves(packed)["rollout/success"] == read_curves(tmp_path)["rollout/success"]
