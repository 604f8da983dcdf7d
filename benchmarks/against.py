"""`toolwire bench --against REF`: REF's agent built into a virtualenv of its own, cached.

REF (a commit, tag or branch of this checkout's repository) is resolved to its commit, and its
tree (`git archive`) installed non-editable with pip into `<cache>/<commit>/venv`, the way a
user installs a release. The harness (every client, every baseline) stays the working tree's:
only the agent's processes run on REF's interpreter, without this checkout on their import
path, so they import REF's `toolwire`. A finished build is kept under its full commit hash
(`build.json` written last marks it complete) and reused by the next run: a branch that moved
resolves to a new commit and gets a new build.

What a REF's benchmark server lacks is handled in one place, `FLAG_SHIMS` below: a flag the
harness passes that REF's server does not take is rewritten there when REF's one behaviour was
that flag's (checked by reading REF's code), else the variants that need it are skipped for REF
with a note naming the flag.
"""

from __future__ import annotations

import fcntl
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

from toolwire.benchmarks.core import Build, RefUnavailable
from toolwire.benchmarks.procs import REPO_ROOT

CACHE_ENV = "TOOLWIRE_BENCH_CACHE"
# A pip install of toolwire with its dependencies takes about 40 s here; more means a stuck
# index or a build that hangs.
BUILD_TIMEOUT_S = 600.0
# Where REF keeps its benchmark modules, newest layout first: one import package `toolwire`
# since issue 26's round, top-level `benchmarks` before (1fb20ac and its time).
BENCHMARK_PACKAGES = ("toolwire.benchmarks", "benchmarks")

# flag=value the harness passes -> what to pass instead to a REF server without that flag
# (None: drop it). Each entry says why REF behaves the same without it.
FLAG_SHIMS: dict[str, str | None] = {
    # Before `--sync` (1fb20ac and its time) the SQLite journal always ran synchronous=FULL
    # (its actors/journal.py), which is what `--sync=full` asks for.
    "--sync=full": None,
    # Before `--journal` every agent ran the memory journal.
    "--journal=memory": None,
}


class BuildError(RuntimeError):
    """REF could not be resolved or built; the message says which step failed and why."""


def default_cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "toolwire" / "bench-builds"


def ref_env() -> dict[str, str]:
    """The environment of REF's processes: nothing of this checkout on the import path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.pop("VIRTUAL_ENV", None)
    return env


def resolve(ref: str, repo: Path = REPO_ROOT) -> str:
    """REF's full commit hash, or a BuildError naming REF."""
    if not ref or ref.startswith("-"):
        raise BuildError(f"--against {ref!r}: not a commit, tag or branch name")
    try:
        out = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
            capture_output=True,
            text=True,
            check=False,
        )
    except FileNotFoundError:
        raise BuildError("--against needs git on PATH") from None
    if out.returncode != 0 or not out.stdout.strip():
        raise BuildError(f"--against {ref!r}: names no commit in {repo}")
    return out.stdout.strip()


def build(
    ref: str,
    cache_dir: Path | None = None,
    *,
    report: Callable[[str], None] = lambda _text: None,
    repo: Path = REPO_ROOT,
) -> Build:
    """REF's build: from the cache if a complete one is there, else built now (under a lock,
    so two runs building the same commit build it once)."""
    commit = resolve(ref, repo)
    cache = cache_dir or default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / commit
    with open(cache / f"{commit}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = target / "build.json"
        if not done.exists():
            if target.exists():
                shutil.rmtree(target)  # a build that did not finish
            report(f"building {ref} ({commit[:12]}) into {target}")
            _build_into(target, commit, repo)
        meta = json.loads(done.read_text())
    return Build(
        key="ref",
        label=f"{ref} ({commit[:12]})" if not commit.startswith(ref) else commit[:12],
        python=str(target / "venv" / "bin" / "python"),
        env=ref_env(),
        commit=commit,
        server_flags=frozenset(meta["server_flags"]),
        benchmarks_package=meta["benchmarks_package"],
    )


def _build_into(target: Path, commit: str, repo: Path) -> None:
    t0 = time.monotonic()
    src = target / "src"
    src.mkdir(parents=True)
    archive = _run(["git", "-C", str(repo), "archive", "--format=tar", commit], "git archive")
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
        tar.extractall(src, filter="data")
    venv = target / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], "python -m venv")
    python = str(venv / "bin" / "python")
    _run(
        [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", str(src)],
        f"pip install of {commit[:12]}",
        cwd=target,
    )
    package = _benchmarks_package(python, target)
    flags = _server_flags(python, package, target)
    shutil.rmtree(src)  # installed, not editable: the venv no longer needs it
    meta = {
        "commit": commit,
        "benchmarks_package": package,
        "server_flags": sorted(flags),
        "build_s": round(time.monotonic() - t0, 1),
    }
    (target / "build.json").write_text(json.dumps(meta, indent=2) + "\n")


def _run(argv: list[str], what: str, cwd: Path | None = None) -> bytes:
    try:
        out = subprocess.run(
            argv, capture_output=True, cwd=cwd, env=ref_env(), timeout=BUILD_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        raise BuildError(f"{what}: did not finish within {BUILD_TIMEOUT_S:.0f} s") from None
    if out.returncode != 0:
        tail = (out.stderr or out.stdout).decode(errors="replace")[-2000:]
        raise BuildError(f"{what} failed (exit {out.returncode}): {tail}")
    return out.stdout


def _benchmarks_package(python: str, cwd: Path) -> str:
    for package in BENCHMARK_PACKAGES:
        probe = subprocess.run(
            [python, "-c", f"import {package}.toolwire_server"],
            capture_output=True,
            cwd=cwd,
            env=ref_env(),
            check=False,
        )
        if probe.returncode == 0:
            return package
    raise BuildError(
        "the build has no benchmark server: none of "
        + ", ".join(f"{p}.toolwire_server" for p in BENCHMARK_PACKAGES)
        + " imports"
    )


def _server_flags(python: str, package: str, cwd: Path) -> set[str]:
    """The flags REF's benchmark server takes, from its `--help`."""
    helped = _run([python, "-m", f"{package}.toolwire_server", "--help"], "server --help", cwd)
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", helped.decode()))


def server_args(build: Build, args: list[str], server: str) -> list[str]:
    """`args` for `build`'s benchmark server: unchanged for the working tree; for REF each flag
    it lacks shimmed (`FLAG_SHIMS`) or refused with RefUnavailable naming it."""
    if build.server_flags is None:
        return args
    out: list[str] = []
    for arg in args:
        flag = arg.split("=", 1)[0]
        if flag in build.server_flags:
            out.append(arg)
        elif arg in FLAG_SHIMS:
            replacement = FLAG_SHIMS[arg]
            if replacement is not None:
                out.append(replacement)
        else:
            raise RefUnavailable(
                f"REF {build.label}: its benchmark server has no {flag} (needed by {server}:"
                f" {arg}); that server's rows were not run on REF"
            )
    return out
