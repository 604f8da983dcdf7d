"""Reading the OS process table in tests: whether a process the agent started is still alive."""

from __future__ import annotations


def proc_state(pid: int) -> str | None:
    """The OS state letter of `pid` (Z: a zombie, exited and not reaped), None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return None


def alive(pid: int) -> bool:
    """True while `pid` runs; a zombie waiting for its reaper has ended and does not count."""
    return proc_state(pid) not in (None, "Z")
