"""A symlink replaced while writes target it (issue 27, defect 4), through a real server: every
write either completes or fails before writing anything, with a text that says so; none ends
`unknown` ("its outcome is unknown") and none blames a permission that was never missing.

A real thread replaces `flip` (unlink, then symlink to `real.txt`) without pause while the
agent's worker threads resolve and write it: the link is missing for microseconds each turn,
so resolving it (os.path.realpath: lstat, then readlink) and checking it (stat, then access)
each see it come and go. Before the fix about a fifth of the writes ended `unknown` (realpath
raised FileNotFoundError before the path's lock) and some `failed` claiming the file was
read-only.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from tests.conftest import LiveServer
from tests.wsclient import is_result, wait_for
from toolwire.actors.tools.files import TEMP_PREFIX

WRITES = 300
# The one failure a write may have here: its path kept changing while it was resolved.
CHANGED = "cannot write flip: a symlink on its path kept changing while it was resolved; nothing was written"  # noqa: E501


@contextmanager
def flipping(link: Path, target: str) -> Iterator[None]:
    stop = threading.Event()

    def flip() -> None:
        while not stop.is_set():
            with suppress(FileNotFoundError):
                os.unlink(link)
            with suppress(FileExistsError):  # a write put a file there meanwhile
                os.symlink(target, link)

    thread = threading.Thread(target=flip, name="flipper")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


async def test_writes_through_a_symlink_being_replaced_say_what_happened(
    live: LiveServer,
) -> None:
    ws = live.workspace
    (ws / "real.txt").write_text("start\n")
    (ws / "flip").symlink_to("real.txt")
    contents = {f"w{i}": f"content {i}\n" for i in range(WRITES)}
    async with live.connect() as conn:
        with flipping(ws / "flip", "real.txt"):
            for call_id, content in contents.items():
                await conn.send(
                    {
                        "type": "call",
                        "chat_id": "c",
                        "call_id": call_id,
                        "tool": "write_file",
                        "args": {"path": "flip", "content": content},
                    }
                )
            results = [await wait_for(conn, is_result(call_id)) for call_id in contents]

    assert [r for r in results if r["outcome"] not in ("completed", "failed")] == []
    for r in results:
        if r["outcome"] == "failed":
            assert r["text"] == CHANGED, r
        else:
            written = contents[r["call_id"]].encode()
            assert r["data"]["bytes"] == len(written), r
    assert any(r["outcome"] == "completed" for r in results)
    # Nothing half-done was left behind by any of them.
    assert [p.name for p in ws.iterdir() if p.name.startswith(TEMP_PREFIX)] == []
