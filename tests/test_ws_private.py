"""transport/ws_private.py: the private names of trio-websocket the server relies on are there,
with the shape it relies on, in the installed release; and every other module goes through it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import trio.testing
import trio_websocket
from trio_websocket import WebSocketConnection

from toolwire.transport import ws_private

ROOT = Path(__file__).resolve().parent.parent


def _stream() -> trio.abc.Stream:
    stream, _ = trio.testing.memory_stream_pair()
    return stream


def test_the_installed_trio_websocket_has_every_private_name_we_use() -> None:
    problems = ws_private.check_private_surface(_stream())
    assert not problems, (
        f"trio-websocket {trio_websocket.__version__} changed private names that "
        "transport/ws_private.py relies on:\n" + "\n".join(problems)
    )


def test_the_docstring_lists_every_checked_name() -> None:
    doc = ws_private.__doc__ or ""
    for private in ws_private.PRIVATE_SURFACE:
        assert f"WebSocketConnection.{private.name}" in doc, private.name


def test_a_dropped_or_changed_name_is_reported_by_name() -> None:
    class Changed(WebSocketConnection):
        async def _send(self, event: Any, extra: int = 0) -> None:  # a changed signature
            raise AssertionError

        def __getattribute__(self, name: str) -> Any:
            if name == "_stream_lock":  # a dropped attribute
                raise AttributeError(name)
            return super().__getattribute__(name)

    problems = ws_private.check_private_surface(_stream(), Changed)
    assert len(problems) == 2, problems
    assert problems[0].startswith("trio_websocket.WebSocketConnection._send: parameters")
    assert problems[1].startswith("trio_websocket.WebSocketConnection._stream_lock: no such")


def test_no_other_module_uses_a_private_name_of_trio_websocket() -> None:
    names = "|".join(re.escape(p.name) for p in ws_private.PRIVATE_SURFACE)
    pattern = re.compile(rf"\.({names})\b")
    offenders = []
    for folder in ("actors", "transport", "cli", "simulation", "benchmarks", "toolwire"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.name == "ws_private.py":
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if pattern.search(line):
                    offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_serving_imports_no_test_helpers() -> None:
    # A test hook never shapes production code (DESIGN.md): the server's import chain must not
    # load trio.testing (it did, for the check above).
    import subprocess
    import sys

    script = (
        "import sys, toolwire.cli.serve, toolwire.transport.server; "
        "print('trio.testing' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "False", done.stderr
