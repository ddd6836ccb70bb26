import dataclasses

import pytest
import yaml

from ragen2_core.config import ConfigError, TrainConfig, config_hash, describe, dump_yaml, load_config
from ragen2_core.schema import flatten, to_dict


def errors_of(source=None, overrides=()):
    with pytest.raises(ConfigError) as info:
        load_config(source, overrides)
    return info.value.errors, str(info.value)


def test_defaults_load():
    cfg = load_config()
    assert cfg == TrainConfig()
    assert cfg.env.name == "frozenlake" and cfg.env.val_seed_start == 1_000_000_000
    assert cfg.env.sokoban.max_solution_len == 10
    assert cfg.warmstart.envs == ["frozenlake", "sokoban"]
    assert cfg.tracking.uri is None and cfg.train.deepspeed_config is None
    assert load_config({}) == cfg


def test_mutable_defaults_not_shared():
    a, b = TrainConfig(), TrainConfig()
    a.warmstart.envs.append("x")
    assert b.warmstart.envs == ["frozenlake", "sokoban"]


def test_yaml_file_round_trip(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("env:\n  name: sokoban\n  slip: 0\n  sokoban: {size: 7}\nalgo:\n  actor_lr: 3.0e-6\n"
                    "tracking: {uri: null, run_name: demo}\n")
    cfg = load_config(path)
    assert cfg.env.name == "sokoban" and cfg.env.sokoban.size == 7
    assert cfg.env.slip == 0.0 and isinstance(cfg.env.slip, float)
    assert cfg.algo.actor_lr == 3e-6 and cfg.tracking.run_name == "demo"
    dumped = dump_yaml(cfg)
    assert load_config(yaml.safe_load(dumped)) == cfg
    (tmp_path / "again.yaml").write_text(dumped)
    assert load_config(str(tmp_path / "again.yaml")) == cfg
    assert dump_yaml(cfg) == dumped


def test_dump_is_sorted():
    dumped = dump_yaml(TrainConfig())
    top = [line.rstrip(":") for line in dumped.splitlines() if not line.startswith(" ")]
    assert top == sorted(top)


def test_override_types():
    cfg = load_config(None, [
        "rollout.group_size=8", "rollout.temperature=0.7", "env.slip=1", "env.name=sokoban",
        "warmstart.enabled=false", "warmstart.envs=[sokoban]", "tracking.uri=http://localhost:5000",
        "env.sokoban.max_solution_len=null",
    ])
    assert cfg.rollout.group_size == 8 and type(cfg.rollout.group_size) is int
    assert cfg.rollout.temperature == 0.7
    assert cfg.env.slip == 1.0 and type(cfg.env.slip) is float
    assert cfg.env.name == "sokoban"
    assert cfg.warmstart.enabled is False
    assert cfg.warmstart.envs == ["sokoban"]
    assert cfg.tracking.uri == "http://localhost:5000"
    assert cfg.env.sokoban.max_solution_len is None


def test_overrides_apply_after_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("rollout: {group_size: 4, n_groups: 2}\n")
    cfg = load_config(path, ["rollout.group_size=16"])
    assert (cfg.rollout.group_size, cfg.rollout.n_groups) == (16, 2)


def test_base_inheritance_and_merge(tmp_path):
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "root.yaml").write_text("env: {name: sokoban, max_turns: 3}\nalgo: {gamma: 0.9}\n")
    (tmp_path / "mid.yaml").write_text("base: shared/root.yaml\nenv: {max_turns: 7}\nrollout: {group_size: 2}\n")
    (tmp_path / "leaf.yaml").write_text("base: mid.yaml\nalgo: {lam: 0.5}\n")
    cfg = load_config(tmp_path / "leaf.yaml")
    assert cfg.env.name == "sokoban"          # from root, kept through the merge
    assert cfg.env.max_turns == 7             # mid overrides root
    assert cfg.algo.gamma == 0.9 and cfg.algo.lam == 0.5
    assert cfg.rollout.group_size == 2


def test_base_cycle_is_an_error(tmp_path):
    (tmp_path / "a.yaml").write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    errors, _ = errors_of(tmp_path / "a.yaml")
    assert "cycle" in errors[0]


def test_missing_base_file(tmp_path):
    (tmp_path / "a.yaml").write_text("base: nope.yaml\n")
    errors, _ = errors_of(tmp_path / "a.yaml")
    assert "not found" in errors[0] and "nope.yaml" in errors[0]


def test_many_errors_in_one_exception():
    errors, text = errors_of({
        "rollout": {"group_sise": 8},
        "env": {"slip": 1.5, "name": "sokobann"},
        "algo": {"actor_lr": "fast"},
    })
    assert len(errors) == 4
    assert "unknown key 'rollout.group_sise' — did you mean 'rollout.group_size'?" in errors
    assert any("env.slip" in e and "1.5" in e and "<= 1" in e for e in errors)
    assert any("env.name" in e and "sokobann" in e and "frozenlake|sokoban" in e for e in errors)
    assert any("algo.actor_lr" in e and "'fast'" in e and "expected float" in e for e in errors)
    for e in errors:
        assert e in text.splitlines()[1 + errors.index(e)]  # one error per line


def test_bool_rejected_for_numbers_and_str_for_int():
    errors, _ = errors_of({"rollout": {"group_size": True, "n_groups": "8"}, "env": {"slip": False}})
    assert len(errors) == 3
    assert any("rollout.group_size" in e and "True" in e and "bool" in e for e in errors)
    assert any("rollout.n_groups" in e and "'8'" in e for e in errors)
    assert any("env.slip" in e for e in errors)


def test_none_only_where_optional():
    cfg = load_config({"tracking": {"uri": None, "run_name": None}, "env": {"sokoban": {"max_solution_len": None}}})
    assert cfg.tracking.uri is None and cfg.env.sokoban.max_solution_len is None
    errors, _ = errors_of({"env": {"name": None}})
    assert "env.name" in errors[0] and "null" in errors[0]


def test_list_elements_validated():
    errors, _ = errors_of({"warmstart": {"envs": ["frozenlake", "maze"]}})
    assert len(errors) == 1 and "warmstart.envs[1]" in errors[0] and "'maze'" in errors[0]
    errors, _ = errors_of({"warmstart": {"envs": "sokoban"}})
    assert "expected a list" in errors[0]


def test_non_mapping_section():
    errors, _ = errors_of({"env": 3, "rollout": [1, 2]})
    assert any(e.startswith("env: expected a mapping") for e in errors)
    assert any(e.startswith("rollout: expected a mapping") for e in errors)


def test_bad_overrides():
    errors, _ = errors_of(None, ["rollout.group_size", "rollout.group_sise=8", "nothing.here=1",
                                 "env.name.deeper=1", "rollout.group_size=abc"])
    assert len(errors) == 5
    assert "malformed" in errors[0] and "dotted.key=value" in errors[0]
    assert "did you mean 'rollout.group_size'" in errors[1]
    assert "unknown key 'nothing'" in errors[2]
    assert "not a section" in errors[3]
    assert "rollout.group_size" in errors[4] and "'abc'" in errors[4]


def test_cross_field_checks():
    errors, _ = errors_of({
        "env": {"max_actions_per_turn": 5, "max_actions": 3},
        "policy": {"hidden_size": 130, "num_heads": 4, "num_kv_heads": 3},
        "filter": {"strategy": "top_k_abs", "value": 2.5},
        "warmstart": {"envs": []},
    })
    assert len(errors) == 5
    assert any(e.startswith("env.max_actions_per_turn") for e in errors)
    assert any(e.startswith("policy.hidden_size") for e in errors)
    assert any(e.startswith("policy.num_heads") for e in errors)
    assert any(e.startswith("filter.value") and "top_k_abs" in e for e in errors)
    assert any(e.startswith("warmstart.envs") for e in errors)
    errors, _ = errors_of({"filter": {"strategy": "top_p", "value": 1.5}})
    assert "(0, 1]" in errors[0]
    assert load_config({"filter": {"strategy": "top_k_abs", "value": 4}}).filter.value == 4.0


def test_config_hash_stable_and_sensitive():
    a = load_config()
    assert config_hash(a) == config_hash(load_config()) and len(config_hash(a)) == 12
    assert config_hash(a) == config_hash(load_config(yaml.safe_load(dump_yaml(a))))
    b = load_config(None, ["rollout.top_k=5"])
    assert config_hash(b) != config_hash(a)
    assert config_hash(dataclasses.replace(a, train=dataclasses.replace(a.train, seed=1))) != config_hash(a)


def test_flatten_keys():
    flat = flatten(load_config())
    assert flat["rollout.group_size"] == 8
    assert flat["env.frozenlake.size"] == 4
    assert flat["warmstart.envs"] == ["frozenlake", "sokoban"]
    assert flat["tracking.uri"] is None
    assert not any(isinstance(v, dict) for v in flat.values())
    assert sum(k.startswith("algo.") for k in flat) == len(to_dict(load_config())["algo"])


def test_describe_lists_every_field():
    text = describe()
    described = {line.split()[0] for line in text.splitlines()}
    assert set(flatten(TrainConfig())) <= described
    line = next(l for l in text.splitlines() if l.startswith("env.name "))
    assert "str" in line and '"frozenlake"' in line and "which environment" in line and "frozenlake|sokoban" in line


def test_every_field_has_help():
    def walk(cls):
        for f in dataclasses.fields(cls):
            assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help"
            if isinstance(f.default_factory, type) and dataclasses.is_dataclass(f.default_factory):
                walk(f.default_factory)
    walk(TrainConfig)


def test_scientific_notation_without_dot_is_a_float():
    # PyYAML follows YAML 1.1, where `3e-3` is a string; configs write it that way all the time.
    cfg = load_config({"algo": {"kl_coef": "1e-3"}}, ["warmstart.lr=3e-3"])
    assert cfg.algo.kl_coef == 0.001 and cfg.warmstart.lr == 0.003
    with pytest.raises(ConfigError, match="algo.kl_coef"):
        load_config({"algo": {"kl_coef": "e-3"}})


def test_filter_presets_from_yaml_override_and_refinement(tmp_path):
    cfg = load_config({"filter": "paper"})
    assert (cfg.filter.strategy, cfg.filter.value, cfg.filter.mode, cfg.filter.include_zero) == ("top_p", 0.9, "softmax", True)
    # A preset stands for the whole section: later overrides refine it field by field.
    cfg = load_config(None, ["filter=paper", "filter.value=0.8"])
    assert (cfg.filter.mode, cfg.filter.value) == ("softmax", 0.8)
    base = tmp_path / "base.yaml"
    base.write_text("filter: nofilter\n")
    child = tmp_path / "child.yaml"
    child.write_text("base: base.yaml\nfilter:\n  loss_scale: sqrt\n")
    cfg = load_config(child)
    assert (cfg.filter.value, cfg.filter.include_zero, cfg.filter.loss_scale) == (1.0, True, "sqrt")
    # The dump is the expanded section, so it reloads to the same config.
    assert load_config(yaml.safe_load(dump_yaml(cfg))) == cfg


def test_unknown_filter_preset_names_the_choices():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["filter=papr"])
    assert "unknown preset 'papr'" in str(e.value) and "paper|nofilter" in str(e.value) and "did you mean 'paper'" in str(e.value)


def test_filter_schedule_checks():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["filter.schedule.kind=linear"])
    assert "filter.schedule.end is null but kind is linear" in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_config(None, ["filter.schedule.kind=cosine", "filter.value=1.0", "filter.schedule.end=1.5"])
    assert "filter.schedule.end (1.5) must be in (0, 1]" in str(e.value)
    # The schedule starts at filter.value: there is no second name for the start.
    with pytest.raises(ConfigError) as e:
        load_config(None, ["filter.schedule.start=1.0"])
    assert "unknown key 'filter.schedule.start'" in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_config(None, ["filter.schedule.end=0.5"])
    assert "filter.schedule.end (0.5) is set but kind is const" in str(e.value)
    with pytest.raises(ConfigError) as e:
        load_config(None, ["filter.schedule.kind=linear", "filter.schedule.end=0.5", "filter.schedule.warmup_steps=20",
                           "train.steps=10"])
    assert "filter.schedule.warmup_steps (20) exceeds train.steps (10)" in str(e.value)


def test_cross_section_checks():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["rollout.n_groups=1"])
    assert "collapse.every (5) needs rollout.n_groups >= 2" in str(e.value)
    load_config(None, ["rollout.n_groups=1", "collapse.every=0"])
    with pytest.raises(ConfigError) as e:
        load_config(None, ["grad_probe.every=5", "train.zero_stage=3"])
    assert "grad_probe.every needs whole parameters" in str(e.value)


def test_group_relative_advantages_need_groups():
    # GRPO / Dr.GRPO with one rollout per group would make every advantage exactly 0.
    for adv in ("grpo", "drgrpo"):
        with pytest.raises(ConfigError) as e:
            load_config(None, [f"algo.advantage={adv}", "rollout.group_size=1"])
        assert f"algo.advantage={adv} compares rollouts within a group, but rollout.group_size is 1" in str(e.value)
        assert "rollout.group_size >= 2" in str(e.value) and "algo.advantage=gae" in str(e.value)
    load_config(None, ["algo.advantage=gae", "rollout.group_size=1"])


def test_objective_fields():
    cfg = load_config(None)
    assert cfg.algo.clip_ratio_c == 3.0 and cfg.algo.kl_estimator == "k3" and cfg.filter.loss_scale_on == "task"
    assert load_config(None, ["algo.clip_ratio_c=null"]).algo.clip_ratio_c is None
    with pytest.raises(ConfigError) as e:
        load_config(None, ["algo.clip_ratio_c=1.0"])
    assert "algo.clip_ratio_c: 1.0 is out of range; it must be > 1" in str(e.value)


def test_a_run_of_no_steps_is_refused():
    # 0 steps once trained nothing and logged a run whose success was NaN; `ragen2 eval` plays a policy
    with pytest.raises(ConfigError, match=r"train.steps: 0 is out of range; it must be >= 1"):
        load_config(None, ["train.steps=0"])
    assert load_config(None, ["train.steps=1"]).train.steps == 1


def test_config_error_survives_pickling():
    # Raised inside a Ray worker, it travels pickled; the list of errors must come back whole.
    import pickle
    err = pickle.loads(pickle.dumps(ConfigError(["a: bad", "b: worse"])))
    assert err.errors == ["a: bad", "b: worse"] and "2 config error(s)" in str(err)
