"""Can a command write where it is told to? The MLflow store a run records into, and output folders
and files: each problem is one message naming the setting, the value and the fix. Nothing is opened
or created to find out.

    resolve_tracking(cfg.tracking.uri)                 # (the URI a run will use, the setting that chose it)
    tracking_problems(uri, "--tracking-uri")           # a store that takes runs
    store_problems(uri)                                # a store to read (``ragen2 ui``): it must exist
    output_problems("runs/x", "train.output_dir")      # writable, and not inside a git directory
"""
from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlparse

# The URI schemes MLflow 3 registers a tracking store for ('' is a plain folder).
TRACKING_SCHEMES = ("", "file", "sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks",
                    "databricks-uc", "uc")


def resolve_tracking(uri: str | None) -> tuple[str, str]:
    """(the URI a run will use, what set it) for messages that name the setting to change."""
    from ragen2_core.tracking.mlflow_sink import default_tracking_uri

    if uri:
        return uri, "tracking.uri"
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"], "$MLFLOW_TRACKING_URI"
    return default_tracking_uri(), "the default MLflow store"


def tracking_problems(uri: str, label: str = "tracking.uri") -> list[str]:
    """The MLflow store ``uri`` can take runs: a scheme MLflow stores runs under and, for a local store
    (sqlite file or folder), a place this process may write. A server is not contacted."""
    scheme = _scheme(uri)
    if scheme not in TRACKING_SCHEMES:
        return [scheme_problem(uri, label)]
    path = _local_store(uri, scheme)
    problem = _unwritable(path, "store", is_file=scheme == "sqlite") if path else None
    return [f"{label}: {uri!r}: {problem}; give a store in a writable folder, e.g. "
            f"--tracking-uri sqlite:///{Path.cwd() / 'mlflow.db'}"] if problem else []


def store_problems(uri: str, label: str = "--tracking-uri") -> list[str]:
    """For commands that only read a store (``ragen2 ui``): a known scheme, and a local store that
    exists, since MLflow would create an empty one on opening it."""
    scheme = _scheme(uri)
    if scheme not in TRACKING_SCHEMES:
        return [scheme_problem(uri, label)]
    path = _local_store(uri, scheme)
    if path is None or path.exists():
        return []
    return [f"{label}: no MLflow store at {path} (from {uri!r}), so nothing has been recorded there; train or "
            "run a sweep first, or pass --tracking-uri of the store they wrote (e.g. sqlite:////abs/path/mlflow.db)"]


def scheme_problem(uri: str, label: str) -> str | None:
    scheme = _scheme(uri)
    if scheme in TRACKING_SCHEMES:
        return None
    return (f"{label}: {uri!r} has the scheme {scheme}://, which MLflow keeps no runs under; use "
            "sqlite:///path/mlflow.db (the default), a folder, http(s)://host:port of a tracking server, "
            "or a postgresql://, mysql:// or mssql:// database")


def _scheme(uri: str) -> str:
    return urlparse(uri).scheme.split("+")[0].lower()


def _local_store(uri: str, scheme: str) -> Path | None:
    if scheme == "sqlite":
        rest = uri.split("://", 1)[1]
        path = rest[1:].split("?", 1)[0] if rest.startswith("/") else ""
        return Path(path) if path and path != ":memory:" else None
    if scheme in ("", "file"):
        return Path(urlparse(uri).path if scheme else uri).expanduser()
    return None


def output_problems(path, field: str, is_file: bool = False) -> list[str]:
    """``path`` can be an output folder (or file): not inside a git directory, creatable or writable."""
    where = Path(path).expanduser()
    git = _git_dir_around(where)
    if git is not None:
        return [f"{field}: {str(path)!r} lies inside the git directory {git}, where git keeps the repository "
                "itself (outputs there can corrupt it or vanish with it); choose a folder outside it"]
    problem = _unwritable(where, "file" if is_file else "folder", is_file=is_file)
    return [f"{field}: {str(path)!r}: {problem}; choose another {'path' if is_file else 'folder'}"] if problem else []


def _git_dir_around(path: Path) -> Path | None:
    """The git directory ``path`` lies in (itself or an ancestor), after resolving symlinks, or None."""
    for d in (path.resolve(), *path.resolve().parents):
        if d.name == ".git" or ((d / "HEAD").is_file() and (d / "objects").is_dir() and (d / "refs").is_dir()):
            return d
    return None


def _unwritable(path: Path, what: str, is_file: bool = False) -> str | None:
    """Why ``path`` (a folder, or with ``is_file`` a file) cannot be created or written, or None.
    Asked with access(2), which knows read-only mounts and immutable files even for root: nothing
    is opened or made."""
    path = path.expanduser().absolute()
    if path.exists():
        if is_file and not path.is_file():
            return f"{path} is not a file"
        if not is_file and not path.is_dir():
            return f"{path} is a file, not a folder"
        if is_file and _denied(path):
            return f"the {what} {path} is not writable ({_denied(path)})"
    folder = path.parent if is_file or not path.exists() else path
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        return f"{folder} is a file, so the {what} {path} cannot be made under it"
    if _denied(folder):
        return f"the folder {folder} is not writable ({_denied(folder)}), so the {what} {path} cannot be written"
    return None


def _denied(path: Path) -> str | None:
    if os.access(path, os.W_OK | (os.X_OK if path.is_dir() else 0)):
        return None
    return "a read-only file system" if os.statvfs(path).f_flag & os.ST_RDONLY else "no write permission"
