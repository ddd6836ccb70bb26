"""Sweep instances: ids, their order, latest and named picks (the real sweep: test_sweep_e2e.py)."""
from types import SimpleNamespace

import yaml

from ragen2_core.sweep.instances import LATEST, known_instances, new_instance, order, pick
from ragen2_core.sweep.spec import read_spec


def spec_in(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "s", "base": "b.yaml", "storage": str(tmp_path / "runs")}))
    (tmp_path / "b.yaml").write_text("{}\n")
    return read_spec(path)


def parent(instance, start):
    return SimpleNamespace(info=SimpleNamespace(start_time=start, run_id=f"run-{instance}"),
                           data=SimpleNamespace(tags={"ragen2.instance": instance} if instance else {}))


def test_new_instances_are_named_by_utc_start_time_and_never_shared(tmp_path):
    spec = spec_in(tmp_path)
    t = 1_796_325_911.0  # calendar.timegm((2026, 12, 3, 19, 25, 11)): 2026-12-03 19:25:11 UTC
    ids = [new_instance(spec, now=t) for _ in range(3)]
    assert ids == ["2026-12-03_19-25-11", "2026-12-03_19-25-11-2", "2026-12-03_19-25-11-3"]
    assert sorted(p.name for p in spec.sweep_root.iterdir()) == sorted(ids)
    spec.instance = ids[1]
    assert spec.sweep_dir == tmp_path / "runs" / "s" / ids[1]


def test_latest_is_the_newest_start_whether_found_as_folder_or_parent_run(tmp_path):
    spec = spec_in(tmp_path)
    assert pick(known_instances(spec, []), LATEST) is None  # nothing to resume yet
    for name in ("2026-12-03_19-25-11", "2026-12-03_19-25-11-2", "2026-12-03_19-25-11-10", "trials"):
        (spec.sweep_root / name).mkdir(parents=True)
    # a parent run from another machine's storage, and one from before instances existed (no tag)
    known = known_instances(spec, [parent("2026-12-04_08-00-00", 2), parent(None, 3)])
    assert list(known) == ["2026-12-03_19-25-11", "2026-12-03_19-25-11-2", "2026-12-03_19-25-11-10",
                           "2026-12-04_08-00-00"]  # -10 after -2: suffixes sort as numbers
    assert known["2026-12-04_08-00-00"].info.run_id == "run-2026-12-04_08-00-00"
    assert known["2026-12-03_19-25-11"] is None  # a folder whose run lives in another MLflow store
    assert pick(known, LATEST) == "2026-12-04_08-00-00"
    assert pick(known, "2026-12-03_19-25-11-2") == "2026-12-03_19-25-11-2"
    assert pick(known, "2026-01-01_00-00-00") is None
    assert order("2026-12-03_19-25-11") < order("2026-12-03_19-25-11-2") < order("2026-12-03_19-25-11-10")
