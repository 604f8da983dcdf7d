"""The one canonical spelling of a path, as the tools resolve it: what the turn planner's
reservations compare (actors/reservations.py) and where the file tools write. Reads the
filesystem (symlinks), so it never runs inside ChatState."""

from __future__ import annotations

import os


def canonical_path(path: str, workspace: str) -> str:
    """Return the absolute, symlink-free form of `path` as the tools would resolve it.

    Steps: `~` is expanded (the tools expand it too, and `~/ws/x` must meet `x`); a relative
    path is joined to the workspace (PROTOCOL.md section 8); then `os.path.realpath` resolves
    every symlink and folds `.` and `..`.

    `..` is folded the way the kernel does it, after resolving the symlink before it: when `ln`
    links to `real/dir`, `ln/../x` is `real/x`, not `x`. That is the file a tool opening the
    path would actually touch, and touching is what reservations are about.

    A path that does not exist yet (the target of a `write_file` that creates a file, maybe
    under directories it creates too) is resolved through its nearest existing parent:
    realpath resolves the existing prefix and appends the rest, so `link-to-d/new.txt` equals
    `d/new.txt` and conflicts with a read of it.

    The workspace is canonicalised too: it may itself be reached through a symlink (`/tmp` is
    one on some systems), and an absolute path spelled through the real directory must match a
    relative one. Raises ValueError for a path with a NUL byte (no tool can open it).
    """
    root = os.path.realpath(os.path.expanduser(workspace))
    return os.path.realpath(os.path.join(root, os.path.expanduser(path)))
