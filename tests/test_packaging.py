"""What `pip install toolwire` puts into site-packages: one import package, `toolwire`, built
from the design card's top-level folders, and nothing else (issue: a project with its own
`cli.py`, `transport/` or `benchmarks/` must neither shadow toolwire nor be shadowed by it)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("actors", "transport", "cli", "simulation", "benchmarks")


def test_the_wheel_installs_exactly_one_top_level_name(tmp_path: Path) -> None:
    # Built from a copy: setuptools writes build/ and *.egg-info beside the sources it builds.
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "toolwire", *FOLDERS):
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy
        copy(ROOT / name, source / name)  # type: ignore[operator]
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(tmp_path), str(source)],
        check=True,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("toolwire-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/", 1)[0] for name in names}
    dist_info = {t for t in top if t.endswith(".dist-info")}
    assert top - dist_info == {"toolwire"}, sorted(top)
    assert len(dist_info) == 1
    # Every module of every mapped folder is in the wheel, under `toolwire.`, and so is every
    # module of the package root (`toolwire.aio` among them).
    for folder in (*FOLDERS, "toolwire"):
        for source in (ROOT / folder).rglob("*.py"):
            relative = source.relative_to(ROOT)
            path = relative if folder == "toolwire" else Path("toolwire", relative)
            assert path.as_posix() in names, source
    assert "toolwire/aio.py" in names and "toolwire/transport/client/aio.py" in names
    entry_points = zipfile.ZipFile(wheel).read(f"{dist_info.pop()}/entry_points.txt").decode()
    assert "toolwire = toolwire.cli.main:main" in entry_points


def test_toolwire_and_toolwire_aio_import_in_a_fresh_interpreter() -> None:
    # A fresh process: what a user's `python -c "import toolwire, toolwire.aio"` does.
    done = subprocess.run(
        [sys.executable, "-c", "import toolwire, toolwire.aio; print(toolwire.aio.__name__)"],
        capture_output=True,
        text=True,
        cwd="/",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "toolwire.aio"


def test_the_asyncio_client_is_reexported_from_toolwire_aio() -> None:
    import toolwire
    import toolwire.aio
    from toolwire.transport.client import aio

    assert toolwire.aio.connect is aio.connect and toolwire.aio.Client is aio.Client
    # The handles and errors are the trio client's own classes: code may catch either.
    assert toolwire.aio.CallHandle is toolwire.CallHandle
    assert toolwire.aio.ConnectError is toolwire.ConnectError
    for name in toolwire.aio.__all__:
        assert getattr(toolwire.aio, name) is not None, name


def test_the_public_api_is_reexported_from_toolwire() -> None:
    import toolwire
    from toolwire.transport import client, ids, protocol

    assert toolwire.connect is client.connect
    assert toolwire.tool_call_id is ids.tool_call_id
    assert toolwire.Result is protocol.Result
    for name in toolwire.__all__:
        assert getattr(toolwire, name) is not None, name
