"""algo/ and metrics/ stay pure math: their imports are checked by parsing, never by importing."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "ragen2_core"
PURE_PACKAGES = ("algo", "metrics")
ALLOWED = {"torch", "numpy", "math", "typing", "dataclasses", "__future__", "functools", "collections"}


def offending_imports(path: Path) -> list[str]:
    """Modules imported by `path` outside ALLOWED; relative imports may only stay in the subpackage."""
    bad = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            bad += [a.name for a in node.names if a.name.split(".")[0] not in ALLOWED]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                if node.module.split(".")[0] not in ALLOWED:
                    bad.append(node.module)
            elif node.level > 1:  # `from ..x import y` leaves the subpackage
                bad.append("." * node.level + (node.module or ""))
    return bad


def test_pure_packages_import_only_math_libraries():
    files = [p for pkg in PURE_PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]
    assert any(p.parent.name == "algo" and p.name != "__init__.py" for p in files)
    problems = [f"{p.relative_to(ROOT.parent)}: imports {m}" for p in files for m in offending_imports(p)]
    assert not problems, "impure imports:\n" + "\n".join(problems)


def test_checker_flags_impure_imports(tmp_path):
    src = tmp_path / "bad.py"
    src.write_text("import torch.nn\nimport mlflow\nfrom ray import tune\nfrom ..config import X\nfrom . import ok\n")
    assert offending_imports(src) == ["mlflow", "ray", "..config"]
