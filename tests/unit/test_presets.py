"""Named whole-section presets: one module, read by configs, sweep specs and reports."""
from ragen2_core import presets
from ragen2_core.config import load_config


def test_expand_replaces_the_section_with_a_copy_and_names_an_unknown_one():
    data = {"filter": "paper", "algo": {"kl_coef": 0.1}}
    assert presets.expand(data) == []
    assert data["filter"] == presets.FILTER["paper"] and data["filter"] is not presets.FILTER["paper"]
    bad = {"filter": "nofiltr"}
    [msg] = presets.expand(bad)
    assert msg.startswith("filter: unknown preset 'nofiltr'") and "did you mean 'nofilter'" in msg
    assert bad == {"filter": "nofiltr"}  # left as it was, for the caller's error report
    assert presets.problem("paper") is None


def test_dotted_keys_refine_a_preset_whatever_their_order():
    pairs = [("filter.value", 0.5), ("algo.kl_coef", 0.1), ("filter", "paper")]
    assert presets.sections_first(pairs) == [("filter", "paper"), ("filter.value", 0.5), ("algo.kl_coef", 0.1)]
    cfg = load_config(None, ["filter=paper", "filter.value=0.5"])
    assert (cfg.filter.mode, cfg.filter.value) == ("softmax", 0.5)


def test_uses_matches_an_mlflow_runs_params_on_every_field():
    from ragen2_core.report.collect import parse_value
    params = {"filter.strategy": "top_p", "filter.value": "1.0", "filter.include_zero": "True", "filter.mode": "linear"}
    assert presets.uses(params, "filter", "nofilter", parse_value)   # mode is not one of nofilter's fields
    assert not presets.uses(params, "filter", "paper", parse_value)  # value 1.0, not 0.9
