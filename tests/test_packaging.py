"""What `pip install toolwire` puts into site-packages: one import package, `toolwire`, built
from the design card's top-level folders, and nothing else (issue: a project with its own
`cli.py`, `transport/` or `benchmarks/` must neither shadow toolwire nor be shadowed by it)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("actors", "transport", "cli", "simulation", "benchmarks", "integrations")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Built from a copy (setuptools writes build/ and *.egg-info beside the sources it builds)
    # that keeps toolwire/'s subpackages as the symlinks git checks out.
    tmp_path = tmp_path_factory.mktemp("wheel")
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "toolwire", *FOLDERS):
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, symlinks=True)
        else:
            shutil.copy(ROOT / name, source / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(tmp_path), str(source)],
        check=True,
    )  # fmt: skip
    (built,) = tmp_path.glob("toolwire-*.whl")
    return built


def test_the_checkout_is_the_package_its_imports_name() -> None:
    # Python, type checkers and editors resolve `toolwire.actors` from the root with no mapping.
    for folder in FOLDERS:
        link = ROOT / "toolwire" / folder
        assert link.is_symlink() and link.resolve() == ROOT / folder, link


def test_the_wheel_installs_exactly_one_top_level_name(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/", 1)[0] for name in names}
    dist_info = {t for t in top if t.endswith(".dist-info")}
    assert top - dist_info == {"toolwire"}, sorted(top)
    assert len(dist_info) == 1
    # Every module of every linked folder is in the wheel, under `toolwire.`, and so is every
    # module of the package root (`toolwire.aio` among them).
    for folder in (*FOLDERS, "toolwire"):
        for source in (ROOT / folder).rglob("*.py"):
            relative = source.relative_to(ROOT)
            path = relative if folder == "toolwire" else Path("toolwire", relative)
            assert path.as_posix() in names, source
    assert "toolwire/aio.py" in names and "toolwire/transport/client/aio.py" in names
    entry_points = zipfile.ZipFile(wheel).read(f"{dist_info.pop()}/entry_points.txt").decode()
    assert "toolwire = toolwire.cli.main:main" in entry_points


def test_after_a_non_editable_install_the_package_imports_from_the_checkout_root(
    wheel: Path, tmp_path: Path
) -> None:
    # `pip install .` then a script next to README.md: the checkout's own toolwire/ comes first
    # on sys.path, so it must be the whole package, not a shell of it (issue 26).
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
         "--no-deps", "--no-index", str(wheel)],
        check=True,
    )  # fmt: skip
    # The dependencies from the test run's own environment, without its .pth files: so not
    # the editable install's finder, which would hide what a plain install does.
    deps = os.pathsep.join(p for p in sys.path if p.endswith("site-packages"))
    script = "import toolwire.aio, toolwire.actors.agent; print(toolwire.actors.agent.__file__)"
    for cwd, home in ((ROOT, ROOT / "toolwire"), (Path("/"), env_dir)):
        done = subprocess.run(
            [str(python), "-c", script],
            capture_output=True,
            text=True,
            cwd=cwd,
            env={**os.environ, "PYTHONPATH": deps},
        )
        assert done.returncode == 0, (cwd, done.stderr)
        assert Path(done.stdout.strip()).is_relative_to(home), (cwd, done.stdout)


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
