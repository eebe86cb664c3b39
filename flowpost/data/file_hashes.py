"""One hash over a set of files' names and contents: a source's fingerprint."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

from flowpost.core.io import sha256_file


def files_fingerprint(root: Path, files: Iterable[Path]) -> str:
    """Hash of each file's name (relative to ``root``, ``../`` outside it, or its own name when ``root`` is that
    file) and contents, ``missing`` for one that does not exist: changes when any of them does."""
    digest = hashlib.sha256()
    for file in files:
        name = file.name if file == root else Path(os.path.relpath(file, root)).as_posix()  # ../ when outside
        digest.update(f"{name}\0{sha256_file(file) if file.is_file() else 'missing'}\n".encode())
    return digest.hexdigest()
