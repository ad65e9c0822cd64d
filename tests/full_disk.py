"""A directory on a small filesystem of its own (a size-limited tmpfs), and a file that fills it: a full disk
under one directory only, for the tests of what the agent and the pipeline do when they cannot write."""

from __future__ import annotations

import contextlib
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

FILLER = "filler"


@contextlib.contextmanager
def small_filesystem(directory: Path, size: str = "1m") -> Iterator[Path]:
    """``directory`` (created) as the mount point of a tmpfs of ``size``, unmounted on exit; skips the test
    when mounting is not permitted (it needs root or CAP_SYS_ADMIN)."""
    directory.mkdir(parents=True, exist_ok=True)
    options = f"size={size},mode=0700"
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(directory)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"a size-limited tmpfs cannot be mounted here (root or CAP_SYS_ADMIN needed): "
                    f"{mounted.stderr.strip()}")
    try:
        yield directory
    finally:
        subprocess.run(["umount", "--lazy", str(directory)], check=True)


def fill(directory: Path) -> Path:
    """Write a file into ``directory`` until its filesystem has no space left; return the file."""
    filler = directory / FILLER
    block = b"\0" * 4096
    with open(filler, "wb", buffering=0) as f:
        with contextlib.suppress(OSError):
            while True:
                f.write(block)
    return filler
