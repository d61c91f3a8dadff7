"""One atomic file write for every file the agent keeps (state files, the DRA checkpoint and CDI specs, the seccomp
profile): a reader sees the old content or the new, never a part, and after a crash or power loss the file is one of
the two.

:func:`write_atomically` writes a temporary file in the same directory (a rename does not cross file systems), syncs
it, renames it over the target and syncs the directory (the rename itself is then on disk). On any failure the
temporary file is removed and the exception goes to the caller; the target is untouched.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from pathlib import Path


def write_atomically(path: Path | str, data: bytes, mode: int = 0o644) -> None:
    """Replace ``path``'s content with ``data`` (permissions ``mode``); OSError when it could not be done."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_directory(path.parent)


def fsync_directory(directory: Path) -> None:
    """Sync a directory's entries (a rename in it); file systems that cannot sync a directory are let be."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)
