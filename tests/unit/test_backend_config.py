"""rollout.backend: the default tier never needs (or imports) vLLM."""
import importlib.util
import subprocess
import sys

import pytest

from ragen2_core.config import ConfigError, load_config

HAVE_VLLM = importlib.util.find_spec("vllm") is not None


def test_default_backend_is_hf_and_training_never_imports_vllm():
    assert load_config(None).rollout.backend == "hf"
    code = ("import sys; import ragen2_core.train.trainer, ragen2_core.rollout.vllm_backend; "
            "print('vllm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"  # the backend module imports vllm only when an engine is built


def test_vllm_backend_config_errors():
    if not HAVE_VLLM:  # the main environment: refused before any work, with the way to get it
        with pytest.raises(ConfigError, match=r"rollout.backend: vllm is not installed.*setup_vllm.sh"):
            load_config(None, ["rollout.backend=vllm"])
        return
    # the .venv-vllm environment: the backend loads, and ZeRO-3's partitioned parameters are refused
    assert load_config(None, ["rollout.backend=vllm"]).rollout.backend == "vllm"
    with pytest.raises(ConfigError, match=r"rollout.backend=vllm copies whole parameters.*zero_stage <= 2"):
        load_config(None, ["rollout.backend=vllm", "train.zero_stage=3"])
