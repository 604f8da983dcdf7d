"""search_files on RE2 beside a line-by-line search with Python's `re` (what search_files did
before issue 27), side by side in one run, and what the alternative, a search in a process of
its own, would cost per call. docs/semantics.md ("search_files") quotes its figures.

    python -m toolwire.benchmarks.search_engines [TREE]

TREE defaults to the test suite of this Python's standard library (3,760 files and 118 MB
for CPython 3.11: repo-sized).
The `re` side reads and matches exactly as the old search did (binary sniff, one decode and
one `re.search` per line); both sides run warm (the tree in the page cache), best of three.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable

from toolwire.actors.tools.files import BINARY_SNIFF_BYTES, VCS_DIRS, SearchFilesArgs, search_files

# Not `(a+)+$` over a tree: on a tree with a long run of a's somewhere (site-packages has
# some) the `re` side does not end; it is measured on one line below.
PATTERNS = ["TODO", r"def \w+\(self", r"^\s*return None$", r"import (os|sys)"]
REDOS_LENGTHS = [18, 20, 22, 24]
MAX_MATCHES = 10**9  # every match: the work of a whole search, not of its first 500


def re_line_by_line(root: str, pattern: str) -> int:
    """The old search_files: Python `re`, one line at a time."""
    regex = re.compile(pattern)
    found = 0
    for directory, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in VCS_DIRS)
        for name in sorted(names):
            path = os.path.join(directory, name)
            try:
                with open(path, "rb") as f:
                    if b"\0" in f.read(BINARY_SNIFF_BYTES):
                        continue
                    f.seek(0)
                    for raw in f:
                        line = raw.decode("utf-8", errors="replace").rstrip("\n")
                        if line.endswith("\r"):
                            line = line[:-1]
                        if regex.search(line) is not None:
                            found += 1
            except OSError:
                continue
    return found


def re2_search_files(root: str, pattern: str) -> int:
    report = search_files(root, SearchFilesArgs(pattern=pattern), max_matches=MAX_MATCHES)
    assert report.data is not None, report.text
    return len(report.data["matches"])


def best_of(runs: int, fn: Callable[[], int]) -> tuple[float, int]:
    times, result = [], 0
    for _ in range(runs):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), result


def tree_size(root: str) -> tuple[int, int]:
    files = size = 0
    for directory, _dirs, names in os.walk(root):
        for name in names:
            try:
                size += os.stat(os.path.join(directory, name)).st_size
                files += 1
            except OSError:
                pass
    return files, size


def main() -> None:
    default = os.path.join(sysconfig.get_paths()["stdlib"], "test")
    root = sys.argv[1] if len(sys.argv) > 1 else default
    files, size = tree_size(root)
    print(f"tree {root}: {files} files, {size / 1e6:.0f} MB")
    print(f"{'pattern':24} {'re, per line':>13} {'RE2 search':>11} {'ratio':>6}  matches")
    for pattern in PATTERNS:
        old, n_old = best_of(3, lambda p=pattern: re_line_by_line(root, p))  # type: ignore[misc]
        new, n_new = best_of(3, lambda p=pattern: re2_search_files(root, p))  # type: ignore[misc]
        same = "same" if n_old == n_new else f"DIFFER {n_old} vs {n_new}"
        print(f"{pattern!r:24} {old:12.2f}s {new:10.2f}s {old / new:5.1f}x  {n_new} ({same})")

    print("\n(a+)+$ against 'a' * N + 'b', one line:")
    import re2  # type: ignore[import-untyped]

    for n in REDOS_LENGTHS:
        line = "a" * n + "b"
        old, _ = best_of(1, lambda line=line: int(re.search("(a+)+$", line) is None))  # type: ignore[misc]
        new, _ = best_of(3, lambda line=line: int(re2.search("(a+)+$", line) is None))  # type: ignore[misc]
        print(f"  N={n}: re {old:.3f} s, RE2 {new * 1e6:.1f} us")

    spawn, _ = best_of(
        5,
        lambda: (
            subprocess.run(
                [sys.executable, "-c", "import toolwire.actors.tools.files"], check=True
            ).returncode
        ),
    )
    with tempfile.TemporaryDirectory() as small:
        with open(os.path.join(small, "a.py"), "w") as f:
            f.write("import os\n" * 50)
        trivial, _ = best_of(5, lambda: re2_search_files(small, "import"))
    print(f"\na process per search (start Python, import the file tools): {spawn * 1e3:.0f} ms")
    print(f"a search of one small file in the agent: {trivial * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
