"""Benchmark servers in their own processes, and what /proc says about a process.

The transport measurements put client and server in separate processes (as the issue's
reference figures were measured): `ServerProcess` runs `python -m toolwire.benchmarks.<module>` on
127.0.0.1 with port 0 and reads the bound port from the `PORT <n>` line it prints.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
# A server that has not printed its port by then is broken, not slow (imports take ~0.3 s).
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 5.0
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# Kernels built with scheduler statistics keep, per thread, its CPU time in nanoseconds and how
# long it waited, runnable, for a CPU; without them a thread's CPU comes from its stat (ticks).
_HAS_SCHEDSTAT = os.path.exists("/proc/self/schedstat")


def child_env() -> dict[str, str]:
    """The environment of a benchmark subprocess: this checkout first on the import path."""
    env = dict(os.environ)
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + path if path else "")
    return env


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a live process (its own threads, not its children)."""
    with open(f"/proc/{pid}/stat") as f:
        # The command name (field 2) may hold spaces: split after its closing parenthesis.
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def keeper_of(server_pid: int) -> int | None:
    """The keeper an agent server started (`toolwire.actors.keeper`, a child of it), or None:
    a build before the keeper, or the memory journal, holds its commands itself."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            if parent != server_pid:
                continue
            argv = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue  # gone meanwhile
        if b"toolwire.actors.keeper" in argv:
            return int(name)
    return None


def rss_bytes(pid: int | str = "self", field: str = "VmRSS") -> int:
    """Resident memory of a process now (VmRSS), or its peak since it started (VmHWM)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


# The loop-lag probe (`benchmarks/loop_lag.py`), run by path so any build's interpreter runs it.
LOOP_LAG_SCRIPT = Path(__file__).resolve().parent / "loop_lag.py"
# The cProfile switch (`benchmarks/profile_probe.py`), run by path for the same reason.
PROFILE_PROBE_SCRIPT = Path(__file__).resolve().parent / "profile_probe.py"
# How long the probe may take to answer `lag`: one loop turn, unless the loop is stalled.
LOOP_LAG_ANSWER_S = 30.0


class ServerProcess:
    """`python -m <module> <args>` serving on 127.0.0.1; `.port` once it is ready. With
    `loop_lag`, the server runs under the loop-lag probe and `.loop_lag()` reads it. With
    `probe`, under that probe script instead (a wrapper run by path that takes the module's
    command line and answers `.control(line)` on its stdin). `launcher` goes before the
    interpreter (e.g. `valgrind --tool=callgrind`), and the timeouts are for a server that runs
    slower under it."""

    def __init__(
        self,
        python: str,
        module: str,
        args: list[str],
        workdir: Path,
        *,
        env: dict[str, str] | None = None,
        loop_lag: bool = False,
        probe: Path | None = None,
        launcher: Sequence[str] = (),
        ready_timeout_s: float = READY_TIMEOUT_S,
        stop_timeout_s: float = STOP_TIMEOUT_S,
    ) -> None:
        self.module = module
        self._stop_timeout_s = stop_timeout_s
        fd, log_name = tempfile.mkstemp(
            prefix=module.rsplit(".", 1)[-1] + "-", suffix=".log", dir=workdir
        )
        self._log_path = Path(log_name)
        self._log = os.fdopen(fd, "wb")  # closed in stop()
        # -P: the probe's own directory (this checkout's benchmarks/) stays off the path.
        if loop_lag:
            probe = LOOP_LAG_SCRIPT
        command = [*launcher, python, "-m", module]
        if probe is not None:
            command = [*launcher, python, "-P", str(probe), module]
        self.proc = subprocess.Popen(
            [*command, *args],
            stdout=subprocess.PIPE,
            stderr=self._log,
            stdin=subprocess.PIPE if probe is not None else subprocess.DEVNULL,
            cwd=str(workdir),
            env=env if env is not None else child_env(),
        )
        self.port = self._read_port(ready_timeout_s)

    def loop_lag(self) -> dict[str, Any]:
        """The probe's figures since the previous call (the first call starts the window):
        `ticks`, `worst_ms`, `p99_ms`, `p50_ms` of a 1 ms ticker on the server's loop."""
        answer: dict[str, Any] = json.loads(self.control("lag"))
        return answer

    def control(self, line: str, timeout_s: float = LOOP_LAG_ANSWER_S) -> str:
        """Send one line to the server's probe and return its one-line answer."""
        if self.proc.stdin is None or self.proc.stdout is None:
            raise RuntimeError(f"{self.module} runs without a probe")
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        answer = self.proc.stdout.readline() if ready else b""
        if not answer:
            raise RuntimeError(f"{self.module}: no answer to {line!r}; see {self._log_path}")
        return answer.decode()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read_port(self, timeout_s: float) -> int:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        line = b""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.1)
            if ready:
                line = self.proc.stdout.readline()
                if line.startswith(b"PORT "):
                    return int(line.split()[1])
                if not line:
                    break
            elif self.proc.poll() is not None:
                break
        self.stop()
        raise RuntimeError(
            f"{self.module} did not report its port (last line {line!r}); "
            f"see {self._log_path}: {self._log_path.read_text()[-2000:]}"
        )

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.proc.pid)

    def rss_bytes(self) -> int:
        return rss_bytes(self.proc.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(self._stop_timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self._log.close()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


TaskTimes = dict[int, tuple[float, float | None]]


def task_times(pid: int) -> TaskTimes:
    """Per live thread of `pid`: (CPU seconds, seconds it waited runnable for a CPU, or None
    where the kernel keeps no scheduler statistics)."""
    out: TaskTimes = {}
    for name in os.listdir(f"/proc/{pid}/task"):
        base = f"/proc/{pid}/task/{name}"
        try:
            if _HAS_SCHEDSTAT:
                with open(f"{base}/schedstat") as f:
                    cpu_ns, wait_ns, _slices = f.read().split()
                out[int(name)] = (int(cpu_ns) / 1e9, int(wait_ns) / 1e9)
            else:
                with open(f"{base}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                out[int(name)] = ((int(fields[11]) + int(fields[12])) / _CLOCK_TICKS, None)
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended since the listing
    return out


@dataclass(frozen=True)
class ThreadTimes:
    """Where one server process's CPU went over a timed section, by thread: its main thread
    (a toolwire server's event loop), all its other threads together (the journal's writer,
    trio's worker threads), and how long the main thread was runnable but waited for a CPU (on
    a machine with fewer free cores than runnable threads). A thread that ended within the
    section is not counted."""

    main_cpu_s: float
    others_cpu_s: float
    main_wait_s: float | None

    @classmethod
    def between(cls, pid: int, before: TaskTimes, after: TaskTimes) -> ThreadTimes:
        def spent(tid: int) -> tuple[float, float | None]:
            cpu, wait = after[tid]
            cpu0, wait0 = before.get(tid, (0.0, 0.0 if wait is not None else None))
            return cpu - cpu0, None if wait is None or wait0 is None else wait - wait0

        main_cpu, main_wait = spent(pid) if pid in after else (0.0, None)
        others = sum(spent(tid)[0] for tid in after if tid != pid)
        return cls(main_cpu, others, main_wait)


class CpuMeter:
    """CPU seconds spent by this process and by one server process over a timed section, and
    the server's split by thread (`ThreadTimes`)."""

    def __init__(self, server_pid: int | None) -> None:
        self.server_pid = server_pid
        self._client0 = 0.0
        self._server0 = 0.0
        self._tasks0: TaskTimes = {}
        self.client_s = 0.0
        self.server_s = 0.0
        self.server_threads: ThreadTimes | None = None

    def start(self) -> None:
        self._client0 = time.process_time()
        if self.server_pid:
            self._server0 = cpu_seconds(self.server_pid)
            self._tasks0 = task_times(self.server_pid)

    def stop(self) -> None:
        self.client_s = time.process_time() - self._client0
        if self.server_pid:
            self.server_s = cpu_seconds(self.server_pid) - self._server0
            after = task_times(self.server_pid)
            self.server_threads = ThreadTimes.between(self.server_pid, self._tasks0, after)
