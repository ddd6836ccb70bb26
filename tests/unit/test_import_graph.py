"""The package's import graph, read by parsing (nothing is imported): each room imports only rooms of a
lower layer or its own, and no module imports itself back through others (function-level imports
included: a circle hidden inside a function is still a circle)."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "ragen2_core"
# Lowest first; a room may import rooms of its own layer or below.
LAYERS = [
    {"atomic", "yamlio", "batches", "schema", "presets"},
    {"config"},
    {"algo", "metrics"},
    {"envs"},
    {"rollout"},
    {"policy"},
    {"tracking", "outputs"},
    {"train"},
    {"report"},
    {"sweep"},
    {"ui", "mi_offline", "cli"},
]
LAYER = {room: i for i, rooms in enumerate(LAYERS) for room in rooms}


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, known: set[str], root: Path = ROOT) -> set[str]:
    """The package modules ``path`` imports (``from a import b`` counts a.b when b is a module)."""
    me = module_name(path, root)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == root.name}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            if base.split(".")[0] != root.name:
                continue
            subs = {f"{base}.{a.name}" for a in node.names} & known
            out |= subs or {base}
    return out - {me}


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    files = sorted(root.rglob("*.py"))
    known = {module_name(p, root) for p in files}
    return {module_name(p, root): imports_of(p, known, root) & known for p in files}


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def upward_imports(g: dict[str, set[str]]) -> list[str]:
    return [f"{a} ({room(a)}, layer {LAYER[room(a)]}) imports {b} ({room(b)}, layer {LAYER[room(b)]})"
            for a, bs in sorted(g.items()) for b in sorted(bs)
            if room(a) in LAYER and room(b) in LAYER and LAYER[room(b)] > LAYER[room(a)]]


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected component of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_every_room_has_a_layer():
    rooms = {room(m) for m in graph()} - {"ragen2_core"}
    assert rooms <= set(LAYER), f"rooms without a layer: {sorted(rooms - set(LAYER))}; add them to LAYERS"


def test_no_room_imports_a_room_above_it():
    problems = upward_imports(graph())
    assert not problems, "imports that reach up a layer:\n" + "\n".join(problems)


def test_no_import_circle():
    found = cycles(graph())
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_checker_finds_a_circle_and_an_upward_import(tmp_path):
    pkg = tmp_path / "ragen2_core"
    (pkg / "rollout").mkdir(parents=True)
    (pkg / "train").mkdir()
    for f in ("__init__.py", "rollout/__init__.py", "train/__init__.py"):
        (pkg / f).write_text("")
    (pkg / "rollout" / "backend.py").write_text("def f():\n    from ragen2_core.train.trainer import score\n")
    (pkg / "train" / "trainer.py").write_text("from ragen2_core.rollout.backend import f\nfrom . import other\n")
    (pkg / "train" / "other.py").write_text("")
    g = graph(pkg)
    assert g["ragen2_core.train.trainer"] == {"ragen2_core.rollout.backend", "ragen2_core.train.other"}
    assert cycles(g) == [["ragen2_core.rollout.backend", "ragen2_core.train.trainer"]]
    assert upward_imports(g) == ["ragen2_core.rollout.backend (rollout, layer 4) imports "
                                 "ragen2_core.train.trainer (train, layer 7)"]


def test_the_sandbox_supervisor_imports_the_standard_library_only():
    """It runs as root beside the sandbox, started as `python -I -S` on its own file: it must stand
    alone, and nothing of the package may widen what runs there."""
    import sys

    tree = ast.parse((ROOT / "envs" / "sandbox" / "supervisor.py").read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"relative import at line {node.lineno}"
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
    assert names and names <= set(sys.stdlib_module_names), sorted(names - set(sys.stdlib_module_names))
