"""Result files appear whole or not at all: written to a temp file in the same directory, then renamed
over the target (`os.replace` is atomic within a filesystem), so a killed process never leaves half a
file for a reader or a resume to trip over. The file gets the mode any new file would (0666 less the
umask), not the temp file's private 0600.

    write_text_atomic(out_dir / "result.json", json.dumps(result))
    folder = build_folder_once(cache / "name", "meta.json", lambda tmp: save_all(tmp))   # folders too
"""
from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable


def write_text_atomic(path: str | Path, text: str) -> None:
    _write_atomic(path, text, "w")


def write_bytes_atomic(path: str | Path, data: bytes) -> None:
    _write_atomic(path, data, "wb")


def _write_atomic(path: str | Path, content, mode: str) -> None:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{path.name}-", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
        # newline="": text goes out exactly as given (binary mode takes no newline argument)
        with os.fdopen(fd, mode, **({} if "b" in mode else {"newline": ""})) as f:
            f.write(content)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def build_folder_once(final: str | Path, marker: str, build: Callable[[Path], object],
                      rebuild: bool = False) -> Path:
    """``final``, built by ``build(tmp)`` into a temp folder beside it and renamed into place, unless
    ``final/marker`` exists already. One lock per folder: concurrent callers (a sweep's trials) build
    it once, and builds of different folders run side by side. ``rebuild`` builds it whatever exists;
    the old copy steps aside only once the new one is whole."""
    final = Path(final)
    root = final.parent
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / marker).exists() and not rebuild:  # built by another process while we waited
            return final
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
        old = root / f".old-{final.name}"
        try:
            build(tmp)
            if final.exists():
                shutil.rmtree(old, ignore_errors=True)
                os.replace(final, old)
            os.replace(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(old, ignore_errors=True)
    return final


def current_umask() -> int:
    """The process umask, read without changing it (os.umask would, racing other threads)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)  # no procfs: the classic read-by-setting
    os.umask(mask)
    return mask
