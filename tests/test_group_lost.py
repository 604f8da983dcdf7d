"""A step on a process group that fails in the shell at once (`GroupLost`), in a real agent
with real commands: the kernel itself refuses the shell's look at the group (see
tests/refused_group_probe.py, which runs the agent in a process of its own under a seccomp
filter). The pure machine covers the same rule in tests/test_chat_state.py."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.oswatch import alive
from tests.refused_group_probe import SHUTDOWN_LIMIT_S

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "aarch64"),
    reason="the probe's seccomp filter is written for Linux on x86_64 and aarch64",
)


def test_a_group_the_shell_cannot_look_at_is_killed_and_the_shutdown_ends(
    tmp_path: Path,
) -> None:
    """Each command exits at once and leaves a child that holds none of its output. The
    shell's watch of the first group, and the shutdown's stop of what lingers of the second,
    fail when they look at the group: each command keeps its real result, each group gets
    SIGKILL, so no child lives on unseen, and `Server.shutdown` ends instead of waiting for a
    report that never comes (before `GroupLost`, it waited forever)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    try:
        # The probe bounds its own waits; this bounds a probe that hangs anyway.
        done = subprocess.run(
            [sys.executable, "-m", "tests.refused_group_probe", str(tmp_path)],
            env=env,
            cwd=str(ROOT),
            capture_output=True,
            timeout=SHUTDOWN_LIMIT_S + 30,
            check=False,
        )
    finally:
        # Whatever happened, no child of the probe outlives the test.
        for pidfile in tmp_path.glob("*.pid"):
            with contextlib.suppress(ValueError, ProcessLookupError):
                os.kill(int(pidfile.read_text()), signal.SIGKILL)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    report = json.loads(done.stdout.decode().splitlines()[-1])
    for call_id in ("watched", "deadline"):
        assert (report[call_id]["outcome"], report[call_id]["exit_code"]) == ("completed", 0)
        assert not alive(report[call_id]["child"]), f"{call_id}: its child lives on"
    # What the test is about happened, where it says: the watch failed before the shutdown,
    # the stop of the spent group during it.
    assert report["failures_before_shutdown"] == ["carrying out WatchGroup failed"]
    assert report["deadline_group_spent"]
    assert report["failures"] == [
        "carrying out WatchGroup failed",
        "carrying out StopGroup failed",
    ]
    assert report["chat_groups_left"] == []
