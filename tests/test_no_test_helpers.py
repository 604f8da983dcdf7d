"""The rules of DESIGN.md's layer paragraph, checked on the source of every product module (the
`toolwire` package: actors, transport, cli, simulation, benchmarks, integrations and the root
modules):

- no module imports `trio.testing` (a test hook never shapes production code);
- no module uses another class's or module's private names: `obj._name` only on `self`, `cls`,
  `super()` or a class of the module itself; no `from m import _name`, no import of a private
  module, no `getattr(obj, "_name")`.

Each exception is one adapter module, named below with its reason, whose docstring names every
private name it uses (so a reader sees the whole surface in one place). The tests follow the
second rule too, but for the white-box reads listed in WHITE_BOX_TESTS, each with its reason.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import toolwire

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("actors", "transport", "cli", "simulation", "benchmarks", "integrations")

# The adapters: the one module per library whose private names toolwire must use.
PRIVATE_ADAPTERS: dict[str, str] = {
    # The server's two hot-path shortcuts through trio-websocket's internals (a message handed
    # to the session from the reader task, a batch of replies in one write under the send
    # lock: issue 6); the module checks that surface against the installed version
    # (tests/test_ws_private.py).
    "transport/ws_private.py": "trio_websocket.WebSocketConnection's privates",
    # trio offers its deterministic scheduler only through its private hook (its own
    # hypothesis plugin uses the same two names); the simulation's seeds depend on it.
    "simulation/virtual_trio.py": "trio._core._run's deterministic scheduling hook",
}
TRIO_TESTING_ADAPTERS: dict[str, str] = {
    # The simulation is the harness of DESIGN.md that runs the real shells in virtual time
    # (MockClock) over in-memory streams; `toolwire serve` never imports trio.testing
    # (tests/test_ws_private.py::test_serving_imports_no_test_helpers).
    "simulation/virtual_trio.py": "the simulation's virtual time and in-memory connections",
}


def product_modules() -> list[Path]:
    # Every package linked into toolwire/ is walked: a new one cannot be left out unseen.
    package = Path(toolwire.__file__).parent
    linked = sorted(p.name for p in package.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert linked == sorted(PACKAGES), linked
    paths = sorted(package.glob("*.py"))
    for folder in PACKAGES:
        paths.extend(sorted((ROOT / folder).rglob("*.py")))
    return paths


def name_of(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


@dataclass(frozen=True)
class Use:
    line: int
    what: str
    name: str  # the private name used


def private_uses(tree: ast.Module) -> Iterator[Use]:
    own_classes = {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ({"self", "cls"} | own_classes):
                continue
            if (
                isinstance(owner, ast.Call)
                and isinstance(owner.func, ast.Name)
                and owner.func.id == "super"
            ):
                continue  # the object's own (inherited) state
            yield Use(node.lineno, ast.unparse(node), node.attr)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                for part in filter(is_private, alias.name.split(".")):
                    yield Use(node.lineno, f"import {alias.name}", part)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            for part in filter(is_private, module.split(".")):
                yield Use(node.lineno, f"from {module} import ...", part)
            for alias in node.names:
                if is_private(alias.name):
                    yield Use(node.lineno, f"from {module} import {alias.name}", alias.name)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and is_private(node.args[1].value)
        ):
            yield Use(node.lineno, ast.unparse(node), node.args[1].value)


def trio_testing_uses(tree: ast.Module) -> Iterator[Use]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "trio.testing" or alias.name.startswith("trio.testing."):
                    yield Use(node.lineno, f"import {alias.name}", alias.name)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            names = {alias.name for alias in node.names}
            if module.startswith("trio.testing") or (module == "trio" and "testing" in names):
                yield Use(node.lineno, f"from {module} import ...", module)
        elif (
            isinstance(node, ast.Attribute)
            and node.attr == "testing"
            and isinstance(node.value, ast.Name)
            and node.value.id == "trio"
        ):
            yield Use(node.lineno, ast.unparse(node), "trio.testing")


def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def test_the_walk_sees_every_product_module() -> None:
    names = {name_of(path) for path in product_modules()}
    # One known module of each package, and the adapters, are in the walk.
    for known in (
        "toolwire/__init__.py",
        "actors/chat_state.py",
        "transport/server.py",
        "cli/main.py",
        "simulation/world.py",
        "benchmarks/runner.py",
        *PRIVATE_ADAPTERS,
        *TRIO_TESTING_ADAPTERS,
    ):
        assert known in names, known


def test_no_product_module_imports_trio_testing() -> None:
    offenders = [
        f"{name_of(path)}:{use.line}: {use.what}"
        for path in product_modules()
        if name_of(path) not in TRIO_TESTING_ADAPTERS
        for use in trio_testing_uses(parse(path))
    ]
    assert not offenders, "\n".join(offenders)


def test_no_product_module_uses_another_class_or_modules_private_names() -> None:
    offenders = [
        f"{name_of(path)}:{use.line}: {use.what}"
        for path in product_modules()
        if name_of(path) not in PRIVATE_ADAPTERS
        for use in private_uses(parse(path))
    ]
    assert not offenders, "\n".join(offenders)


# The tests' own white-box reads of a product private, each a known debt with its reason: the
# check below fails on any new one, and on any of these once it is gone (then delete its line).
WHITE_BOX_TESTS: dict[tuple[str, str], str] = {
    ("tests/clientshells.py", "client._ws"): (
        "send_raw/close_websocket act on the client's current WebSocket as no caller of the "
        "client can (a frame it would never send, a close it did not ask for)"
    ),
    ("tests/test_file_tools.py", "files._check_text"): (
        "the two text readers of read_file and edit_files are compared piece by piece"
    ),
    ("tests/test_file_tools.py", "files._fd_text_lines"): (
        "the two text readers of read_file and edit_files are compared piece by piece"
    ),
    ("tests/test_file_tools.py", "files._fd_sniff"): (
        "read_file's line reader starts from its sniff, so the comparison above starts there too"
    ),
    ("tests/test_file_tools.py", "files._whole_text"): (
        "read_file takes a small text file whole: without this the property comparing that path "
        "with the line by line one could hold because neither path is the whole one"
    ),
    ("tests/test_journal.py", "journal._db"): (
        "PRAGMA synchronous is a setting of the journal's own connection, seen from no other"
    ),
    ("tests/test_semantics.py", "live.server._sessions"): (
        "a stalled connection's sender buffer, which no public view of the server shows"
    ),
    ("tests/test_transport.py", "live.server._sessions"): (
        "a session's outbox and send buffer stay bounded, which no public view shows"
    ),
    ("tests/test_spawn.py", "processes._RealProcess"): (
        "a process handle on a stand-in pipe, to fill the pipe byte-exactly"
    ),
}


def test_the_tests_read_no_product_private_but_the_known_ones() -> None:
    found: set[tuple[str, str]] = set()
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for use in private_uses(parse(path)):
            found.add((name_of(path), use.what))
    new = sorted(found - WHITE_BOX_TESTS.keys())
    assert not new, "new private uses in tests:\n" + "\n".join(f"{f}: {w}" for f, w in new)
    gone = sorted(WHITE_BOX_TESTS.keys() - found)
    assert not gone, f"no longer used, delete from WHITE_BOX_TESTS: {gone}"


def test_each_adapter_names_every_private_name_it_uses() -> None:
    for adapter in PRIVATE_ADAPTERS:
        tree = parse(ROOT / adapter)
        doc = ast.get_docstring(tree) or ""
        used = {use.name for use in private_uses(tree)}
        assert used, f"{adapter} uses no private name: it is no adapter any more"
        missing = sorted(name for name in used if name not in doc)
        assert not missing, f"{adapter}'s docstring does not name {missing}"
    for adapter in TRIO_TESTING_ADAPTERS:
        assert list(trio_testing_uses(parse(ROOT / adapter))), adapter


def test_the_checks_find_what_they_forbid() -> None:
    # The walk above passes by finding nothing: here each rule finds its own example.
    source = """
import trio.testing
from trio import testing
from trio._core import _run
from toolwire.actors import journal
class Mine:
    _count = 0
    def go(self, other):
        Mine._count += 1
        self._own()
        super()._inherited()
        other._theirs()
        journal._UPSERT
        getattr(other, "_hidden")
        trio.testing.MockClock()
"""
    tree = ast.parse(source)
    assert sorted(use.name for use in private_uses(tree)) == [
        "_UPSERT",
        "_core",
        "_hidden",
        "_run",
        "_theirs",
    ]
    assert len(list(trio_testing_uses(tree))) == 3
