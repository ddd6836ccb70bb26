"""ragen2: diagnose and prevent template collapse in multi-turn agent RL."""
__version__ = "0.1.0"
