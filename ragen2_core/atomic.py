"""Result files appear whole or not at all: written to a temp file in the same directory, then renamed
over the target (`os.replace` is atomic within a filesystem), so a killed process never leaves half a
file for a reader or a resume to trip over. The file gets the mode any new file would (0666 less the
umask), not the temp file's private 0600.

    write_text_atomic(out_dir / "result.json", json.dumps(result))
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path


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
