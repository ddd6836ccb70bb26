"""The top-level reports/*.py scripts loaded as modules, so tests call their main() in-process."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "reports" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
