"""A small disk of its own for a test: a tmpfs mounted over a folder, and a ballast
that fills it (root or CAP_SYS_ADMIN; :func:`support.require` says so otherwise)."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

from support import require


@contextlib.contextmanager
def tiny_tmpfs(path: Path, size: str = "2m") -> Iterator[Path]:
    """``path`` (made if missing) as a tmpfs of ``size`` while the block runs."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    require(
        done.returncode == 0,
        f"mount -t tmpfs (root or CAP_SYS_ADMIN): {done.stderr.strip() or done.returncode}",
    )
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(path: Path, leave_bytes: int) -> Path:
    """Fill the file system of ``path`` until only ``leave_bytes`` are free."""
    ballast = path / "ballast"
    free = shutil.disk_usage(path).free
    with open(ballast, "wb") as f, contextlib.suppress(OSError):
        f.write(b"\0" * max(0, free - leave_bytes))
    return ballast
