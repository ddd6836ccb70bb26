"""Shared test gates.

``sandbox``: tests that run programs in the code sandbox fail, loudly and with the reason, on a
machine that cannot sandbox (no bubblewrap, not root, ...), instead of skipping unseen. Set
RAGEN2_SKIP_SANDBOX_TESTS=1 to skip them on purpose (the reason is still printed)."""
import os
import sys

import pytest

SKIP_VARIABLE = "RAGEN2_SKIP_SANDBOX_TESTS"


@pytest.fixture
def sandbox():
    from ragen2_core.envs import sandbox as module

    problem = module.isolation_problem()
    if problem:
        why = f"sandbox tests cannot run here: {problem}"
        print(f"\n{why}", file=sys.stderr)
        if os.environ.get(SKIP_VARIABLE) == "1":
            pytest.skip(f"{why} ({SKIP_VARIABLE}=1)")
        pytest.fail(f"{why}. To skip the sandbox tests on purpose, set {SKIP_VARIABLE}=1.", pytrace=False)
    return module
