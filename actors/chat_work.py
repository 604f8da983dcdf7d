"""The effects of one chat that take time, carried out for the shell: tools (on the loop, on a
worker thread, or a wait a cancel can end), commands (spawn, pump, reap, the stop of a group),
the resolution of a turn's paths and timers. Each runs as a task of the chat's nursery and
reports what happened through `feed`, as an input for `ChatState`; none decides anything.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

import msgspec
import trio

from toolwire.actors import keeper_store, kept, observe, processes, reservations, runners, stdin
from toolwire.actors.context import AgentContext
from toolwire.actors.effects import (
    Adopt,
    Adopted,
    AlreadyExited,
    CancelTimer,
    Deadline,
    GraceOver,
    GroupEmpty,
    GroupGone,
    GroupStopped,
    HolderGone,
    Input,
    KillGroup,
    MarkTimedOut,
    OutputClosed,
    ProcessExited,
    ProcessSnapshot,
    ReleaseKept,
    ResolveTurn,
    RunTool,
    Spawn,
    Spawned,
    SpawnFailed,
    StartTimer,
    StopGroup,
    StopRun,
    ToolEnded,
    ToolFailed,
    ToolStopped,
    TurnPlanned,
    WatchGroup,
)
from toolwire.actors.followers import Followers
from toolwire.actors.results import ToolwireError
from toolwire.actors.tools import execute as execute_tool
from toolwire.actors.tools import files as file_tools
from toolwire.actors.tools import process_tools, write_scope
from toolwire.actors.tools.registry import TOOLS, ProcessOp, StoppableOnThread

log = logging.getLogger("toolwire.chat")


def run_on_loop(
    effect: RunTool,
    chat_id: str,
    ctx: AgentContext,
    table: processes.ProcessTable,
    feed: Callable[[Input], None],
) -> None:
    """A short tool run right here: no task, no context switch (the path of the "trivial
    call" benchmark). Nothing of it outlives the call, so it needs no `ChatWork`: the shell
    runs it without making one (a chat that only reads would make and drop one per call)."""
    try:
        report = runners.run_tool(TOOLS[effect.tool], effect.args, ctx.workspace, table, ctx.hidden)
    except Exception:
        log.exception(
            "tool %s failed", effect.tool, extra={"chat_id": chat_id, "call_id": effect.call_id}
        )
        feed(ToolFailed(effect.call_id))
        return
    feed(ToolEnded(effect.call_id, report))


def failure_text(exc: BaseException) -> str:
    """What a turn's resolution that raised says in its calls' results (the log has the
    traceback)."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class ChatWork:
    """Tools, commands and timers of one chat (see the module docstring)."""

    __slots__ = (
        "_adoptable",
        "_feed",
        "_followers",
        "_searches",
        "_spawn",
        "_spawning",
        "_stoppable",
        "_timers",
        "chat_id",
        "ctx",
        "processes",
    )

    def __init__(
        self,
        chat_id: str,
        ctx: AgentContext,
        table: processes.ProcessTable,
        followers: Followers,
        feed: Callable[[Input], None],
        spawn: Callable[..., None],
    ) -> None:
        self.chat_id = chat_id
        self.ctx = ctx
        self.processes = table
        self._followers = followers
        self._feed = feed
        self._spawn: Callable[..., None] = spawn
        self._timers: dict[tuple[str, str], trio.CancelScope] = {}
        self._stoppable: dict[str, trio.CancelScope] = {}
        # The running searches, by call: a cancel sets the flag, the worker thread sees it.
        self._searches: dict[str, threading.Event] = {}
        # Processes found again at a restart, until their call asks to adopt them.
        self._adoptable: dict[str, kept.Readopted] = {}
        # Spawns asked of the keeper whose reply has not come yet.
        self._spawning: dict[str, _KeptSpawn] = {}

    @property
    def idle(self) -> bool:
        """No timer set, no tool a cancel could stop, no spawn waiting for the keeper:
        nothing here outlives the moment."""
        return (
            not self._timers
            and not self._stoppable
            and not self._searches
            and not self._adoptable
            and not self._spawning
        )

    @property
    def spawning(self) -> bool:
        """A spawn asked of the keeper waits for its reply (the chat must stay to take it)."""
        return bool(self._spawning)

    def run_tool(self, effect: RunTool) -> None:
        policy = self.ctx.effective_sandbox(effect.sandbox)
        if policy.filesystem != "full":
            refused = write_scope.refused_write(
                self.ctx.sandbox, policy, self.ctx.workspace, effect.args
            )
            if refused is not None:
                self._feed(ToolEnded(effect.call_id, refused))
                return
        if effect.on_loop:
            run_on_loop(effect, self.chat_id, self.ctx, self.processes, self._feed)
            return
        tool = TOOLS[effect.tool]
        scope = trio.CancelScope()
        args = effect.args
        match tool.run:
            case ProcessOp.INPUT:
                assert isinstance(args, process_tools.ProcessInputArgs)
                # Joins its process's queue now, synchronously: inputs write in the order their
                # calls started (their start rows' order), never in the order tasks get to run.
                ticket = stdin.join_input(self.processes, args.process_id)
                self._stoppable[effect.call_id] = scope
                self._spawn(self._input_task, effect.call_id, args, ticket, scope)
            case StoppableOnThread() as work:
                # Registered now: a cancel may come before the task runs.
                stop = self._searches[effect.call_id] = threading.Event()
                self._spawn(self._stoppable_file_task, effect, work, stop)
            case ProcessOp.OUTPUT:
                self._stoppable[effect.call_id] = scope
                self._spawn(self._run_tool_task, effect, scope)
            case _:
                self._spawn(self._run_tool_task, effect, scope)

    async def _stoppable_file_task(
        self, effect: RunTool, work: StoppableOnThread[Any], stop: threading.Event
    ) -> None:
        """File work on a worker thread (a search): a cancel (`stop_run`) stops it between two
        blocks of work, and it ends `canceled`; one that ended first keeps its real result."""
        call_id = effect.call_id
        try:
            report = await runners.run_stoppable_in_thread(
                work, effect.args, self.ctx.workspace, stop, self.ctx.hidden
            )
        except file_tools.SearchStopped:
            self._feed(ToolStopped(call_id))
            return
        except Exception:
            log.exception(
                "tool %s failed",
                effect.tool,
                extra={"chat_id": self.chat_id, "call_id": call_id},
            )
            self._feed(ToolFailed(call_id))
            return
        finally:
            self._searches.pop(call_id, None)
        self._feed(ToolEnded(call_id, report))

    async def _input_task(
        self,
        call_id: str,
        args: process_tools.ProcessInputArgs,
        ticket: stdin.InputTicket,
        scope: trio.CancelScope,
    ) -> None:
        """A `process_input` (PROTOCOL.md 9.1): a cancel ends it `canceled`, with `written`
        telling what went in; its place in the queue is freed whatever happens."""
        try:
            report = await process_tools.process_input(
                ticket, args, self.ctx.limits.max_wait_ms, scope
            )
        except Exception:
            log.exception(
                "tool process_input failed", extra={"chat_id": self.chat_id, "call_id": call_id}
            )
            self._feed(ToolFailed(call_id))
            return
        finally:
            stdin.leave_input(ticket)
            self._stoppable.pop(call_id, None)
        self._feed(ToolEnded(call_id, report))

    async def _run_tool_task(self, effect: RunTool, scope: trio.CancelScope) -> None:
        try:
            with scope:
                tool = TOOLS[effect.tool]
                if tool.run is ProcessOp.OUTPUT:
                    assert isinstance(effect.args, process_tools.ProcessOutputArgs)
                    report = await runners.wait_for_process(
                        self.processes, effect.args, self.ctx.limits.max_wait_ms
                    )
                else:
                    report = await runners.run_tool_in_thread(
                        tool, effect.args, self.ctx.workspace, self.processes, self.ctx.hidden
                    )
        except Exception:
            log.exception(
                "tool %s failed",
                effect.tool,
                extra={"chat_id": self.chat_id, "call_id": effect.call_id},
            )
            self._feed(ToolFailed(effect.call_id))
            return
        finally:
            self._stoppable.pop(effect.call_id, None)
        if scope.cancelled_caught:
            self._feed(ToolStopped(effect.call_id))
        else:
            self._feed(ToolEnded(effect.call_id, report))

    def stop_run(self, effect: StopRun) -> None:
        scope = self._stoppable.get(effect.call_id)
        if scope is not None:
            scope.cancel()
        search = self._searches.get(effect.call_id)
        if search is not None:
            search.set()

    # -----------------------------------------------------------------------------------------
    # Turns

    def resolve_turn(self, effect: ResolveTurn) -> None:
        self._spawn(self._resolve_task, effect)

    async def _resolve_task(self, effect: ResolveTurn) -> None:
        """A turn's paths resolved on a worker thread, so that a slow or network filesystem
        holds up this turn only, never the loop every chat shares. A failure becomes the
        turn's calls' results (ChatState decides them), never the chat's."""
        try:
            found = await trio.to_thread.run_sync(
                reservations.reserve, effect.specs, self.ctx.workspace
            )
        except Exception as exc:
            log.exception(
                "resolving the paths of turn %r failed",
                effect.turn_id,
                extra={"chat_id": self.chat_id},
            )
            self._feed(TurnPlanned(effect.turn_id, (), failure=failure_text(exc)))
            return
        self._feed(TurnPlanned(effect.turn_id, found))

    # -----------------------------------------------------------------------------------------
    # Processes

    def spawn_process(self, effect: Spawn) -> None:
        args = effect.args
        assert isinstance(args, execute_tool.ExecuteArgs)
        call_id = effect.call_id
        try:
            # Refused again here, never run unconfined: a gate parked before a restart onto a
            # kernel that enforces less ends `failed` with nothing run.
            confinement = self.ctx.sandbox.confinement(
                self.ctx.effective_sandbox(effect.sandbox),
                self.ctx.workspace,
                terminal=execute_tool.terminal_for(args) is not None,
                hidden=self.ctx.hidden,
            )
        except ToolwireError as exc:
            self._feed(SpawnFailed(call_id, exc.message))
            return
        keeper = self.ctx.keeper
        if keeper is not None:
            # Held by the keeper, so that it outlives this agent (PROTOCOL.md 10.1). Asked
            # without waiting: its reply comes to `_KeptSpawn`, and only then is the process
            # listed and `Spawned` fed (ChatState holds the call meanwhile).
            waiter = _KeptSpawn(self, effect, args.command)
            try:
                keeper.start_spawn(
                    execute_tool.argv_for(args),
                    execute_tool.cwd_for(args, self.ctx.workspace),
                    execute_tool.env_for(args, self.ctx.base_env),
                    waiter,
                    stdin=execute_tool.stdin_for(args),
                    terminal=execute_tool.terminal_for(args),
                    confinement=confinement,
                    keep=kept.KeepInfo(
                        self.chat_id,
                        call_id,
                        msgspec.to_builtins(args),
                        effect.started_at_ms,
                        kill_after_ms=args.kill_after_ms,
                        grace_ms=int(self.ctx.kill_grace_s * 1000),
                    ),
                )
            except OSError as exc:  # nothing was asked
                self._feed(SpawnFailed(call_id, exc.strerror or str(exc)))
                return
            self._spawning[call_id] = waiter
            return
        try:
            proc = self.processes.spawn(
                call_id,
                args.command,
                execute_tool.argv_for(args),
                execute_tool.cwd_for(args, self.ctx.workspace),
                execute_tool.env_for(args, self.ctx.base_env),
                effect.started_at_ms,
                stdin=execute_tool.stdin_for(args),
                terminal=execute_tool.terminal_for(args),
                confinement=confinement,
            )
        except OSError as exc:
            self._feed(SpawnFailed(call_id, exc.strerror or str(exc)))
            return
        self._spawned(proc)

    def _spawned(self, proc: processes.ProcessRecord) -> None:
        self._start(proc)
        assert proc.handle.pid is not None
        self._feed(Spawned(proc.process_id, proc.handle.pid, runners.snapshot(proc)))

    def kept_spawned(self, waiter: _KeptSpawn, proc: processes.ProcessRecord) -> None:
        """The keeper answered `waiter`'s spawn: `proc` runs, held by it."""
        self._forget_spawn(waiter)
        self._spawned(proc)

    def kept_spawn_ended(self, waiter: _KeptSpawn, report: Input) -> None:
        """`waiter`'s spawn is over without a process to hold: `report` says how."""
        self._forget_spawn(waiter)
        self._feed(report)

    def _forget_spawn(self, waiter: _KeptSpawn) -> None:
        if self._spawning.get(waiter.call_id) is waiter:
            del self._spawning[waiter.call_id]

    def hold_for_adoption(self, readopted: kept.Readopted) -> None:
        """A restored call's process, found again at start: adopted when `Adopt` asks."""
        self._adoptable[readopted.meta.call_id] = readopted

    def adopt_process(self, effect: Adopt) -> None:
        readopted = self._adoptable.pop(effect.call_id, None)
        if readopted is None:
            self._feed(ToolFailed(effect.call_id))
            return
        meta = readopted.meta
        handle: processes.SpawnedProcess
        if readopted.handle is not None:
            handle = readopted.handle
        else:
            assert readopted.status is not None  # a process gone unrecorded is not adopted
            handle = kept.RecordedProcess(meta.pid, readopted.status, readopted.path)
        command = meta.args.get("command", "") if isinstance(meta.args, dict) else ""
        proc = self.processes.add(
            effect.call_id, command, handle, meta.started_at_ms, output=readopted.output
        )
        self._start(proc)
        self._feed(Adopted(effect.call_id, meta.pid, runners.snapshot(proc)))

    def release_kept(self, effect: ReleaseKept) -> None:
        readopted = self._adoptable.pop(effect.call_id, None)
        if readopted is None:
            return
        handle = readopted.handle
        if handle is None:
            if readopted.status is None:
                kept.stop_orphan(readopted.meta)  # its keeper is gone; it may still run
            keeper_store.remove(readopted.path)
            return
        if readopted.status is None:
            handle.signal_group(signal.SIGKILL)  # nothing left running that no call answers for
        handle.release()

    def _start(self, proc: processes.ProcessRecord) -> None:
        """The pump and the reaper of a process just listed."""
        call_id = proc.process_id
        self._followers.spawned(call_id, proc)
        counter = observe.OutputCounter(self.ctx)

        def on_output(proc: processes.ProcessRecord) -> None:
            counter.update(proc.output.total)
            self._followers.output_arrived(call_id)

        self._spawn(self._pump, proc, on_output)
        self._spawn(self._reap, proc, on_output)

    async def _pump(
        self,
        proc: processes.ProcessRecord,
        on_output: Callable[[processes.ProcessRecord], None],
    ) -> None:
        try:
            await processes.pump(proc, on_output)
        except Exception:
            log.exception(
                "output pump failed", extra={"chat_id": self.chat_id, "call_id": proc.process_id}
            )
        self._feed(OutputClosed(proc.process_id))

    async def _reap(
        self,
        proc: processes.ProcessRecord,
        on_output: Callable[[processes.ProcessRecord], None],
    ) -> None:
        try:
            await processes.reap(proc, self.ctx.wall_ms, self.processes.exited)
            # What the command wrote before it exited, without waiting for EOF (a background
            # child may hold the pipe for long).
            processes.drain_available(proc, on_output)
            snapshot = runners.snapshot(proc)
        except kept.KeeperLost:
            # Its keeper was killed (10.1): nothing of the group runs on unseen, and the call
            # ends `unknown` with the output read up to then (ChatState decides).
            await _give_up(proc, self.processes)
            self._feed(HolderGone(proc.process_id, runners.snapshot(proc)))
            return
        except Exception:
            # Its exit can no longer be known: the call ends `unknown`, and the command is
            # given up (see `_give_up`).
            self._failed("waiting for the command's exit", proc.process_id)
            await _give_up(proc, self.processes)
            self._feed(ToolFailed(proc.process_id))
            # It counts as exited now (nothing is known of it): its slot and listing end.
            self._feed(ProcessExited(proc.process_id, _gone(proc.process_id)))
            return
        self._feed(ProcessExited(proc.process_id, snapshot))

    def stop_group(self, effect: StopGroup) -> None:
        proc = self.processes.get(effect.call_id)
        if proc is None:
            self._feed(GroupStopped(effect.call_id, _gone(effect.call_id)))
            return
        if effect.unless_exited and processes.has_exited(proc):
            self._feed(AlreadyExited(effect.call_id))
            return
        if effect.only_if_alive and not proc.handle.group_alive():
            self._feed(AlreadyExited(effect.call_id))
            return
        if effect.timed_out:
            proc.timed_out = True
        if effect.canceled:
            proc.canceled = True
        self._spawn(self._term_task, proc, effect.grace_s)

    def watch_group(self, effect: WatchGroup) -> None:
        proc = self.processes.get(effect.call_id)
        if proc is None or not proc.handle.group_alive():
            self._feed(GroupGone(effect.call_id))
            return
        self._spawn(self._watch_task, proc)

    async def _watch_task(self, proc: processes.ProcessRecord) -> None:
        try:
            await processes.wait_until_group_empty(proc, max_delay_s=processes.GROUP_WATCH_MAX_S)
        except Exception:
            # The watch is over either way: what waits for the group to go is not held forever.
            self._failed("watching the command's process group", proc.process_id)
        self._feed(GroupGone(proc.process_id))

    async def _term_task(self, proc: processes.ProcessRecord, grace_s: float) -> None:
        try:
            emptied = await runners.term_group(proc, grace_s)
        except Exception:
            # On to the SIGKILL, as when the grace runs out: the stop goes on.
            self._failed("stopping the command's process group (SIGTERM)", proc.process_id)
            emptied = False
        self._feed(GroupEmpty(proc.process_id) if emptied else GraceOver(proc.process_id))

    def kill_group(self, effect: KillGroup) -> None:
        proc = self.processes.get(effect.call_id)
        if proc is None:
            self._feed(GroupStopped(effect.call_id, _gone(effect.call_id)))
            return
        self._spawn(self._kill_task, proc)

    async def _kill_task(self, proc: processes.ProcessRecord) -> None:
        try:
            await runners.kill_group(proc)
            processes.drain_available(proc, lambda p: self._followers.output_arrived(p.process_id))
            snapshot = runners.snapshot(proc)
        except Exception:
            # Whether the group is gone can no longer be known: a call still running ends
            # `unknown`, and the stop is over (what waits for it is not held forever).
            self._failed("killing the command's process group", proc.process_id)
            self._feed(ToolFailed(proc.process_id))
            snapshot = _gone(proc.process_id)
        self._feed(GroupStopped(proc.process_id, snapshot))

    def _failed(self, what: str, call_id: str) -> None:
        log.exception("%s failed", what, extra={"chat_id": self.chat_id, "call_id": call_id})

    def mark_timed_out(self, effect: MarkTimedOut) -> None:
        proc = self.processes.get(effect.call_id)
        if proc is not None:
            proc.timed_out = True

    # -----------------------------------------------------------------------------------------
    # Timers

    def start_timer(self, effect: StartTimer) -> None:
        old = self._timers.pop(effect.key, None)
        if old is not None:
            old.cancel()
        scope = trio.CancelScope(deadline=effect.at)
        self._timers[effect.key] = scope
        self._spawn(self._timer_task, effect, scope)

    async def _timer_task(self, effect: StartTimer, scope: trio.CancelScope) -> None:
        with scope:
            await trio.sleep_forever()
        if self._timers.get(effect.key) is not scope:
            return  # canceled, or replaced by a newer timer of the same key
        del self._timers[effect.key]
        fire = effect.fire
        if isinstance(fire, Deadline):
            proc = self.processes.get(fire.call_id)
            fire = Deadline(fire.call_id, runners.snapshot(proc) if proc is not None else None)
        self._feed(fire)

    def cancel_timer(self, effect: CancelTimer) -> None:
        scope = self._timers.pop(effect.key, None)
        if scope is not None:
            scope.cancel()


# How long a command whose reaper failed is waited for after its SIGKILL (SIGKILL ends a
# process within milliseconds; this only bounds a wait that has already failed once).
GIVE_UP_REAP_S = 1.0


async def _give_up(proc: processes.ProcessRecord, table: processes.ProcessTable) -> None:
    """A command whose exit can no longer be waited for: its group is killed, so nothing of it
    runs on unseen, it is reaped if it can be, and it counts as exited, so that nothing waits
    for it forever (a cancel's stop, a close, the shutdown: all wait for `exited`)."""
    pid = proc.handle.pid
    with contextlib.suppress(Exception):
        proc.handle.signal_group(signal.SIGKILL)
    with trio.move_on_after(GIVE_UP_REAP_S):
        while pid is not None:
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == pid:  # noqa: ASYNC222 - WNOHANG never blocks
                    break
            except ChildProcessError:
                break  # reaped already, or not ours to reap
            await trio.sleep(0.01)
    proc.exited.set()
    table.exited(proc)
    proc.notify()


def _gone(call_id: str) -> ProcessSnapshot:
    """A command the table no longer lists (swept after it exited): nothing left to tell."""
    return ProcessSnapshot(call_id, None, None, True, "", 0, 0)


class _KeptSpawn:
    """A spawn asked of the keeper, until its reply (`kept.SpawnWaiter`): the process is
    listed, its pump and reaper started and `Spawned` fed only once the keeper answered. The
    keeper gone, or silent past its timeout, the call ends `unknown` (`ToolFailed`): the
    command may have started."""

    __slots__ = ("_command", "_started_at_ms", "_work", "call_id")

    def __init__(self, work: ChatWork, effect: Spawn, command: str) -> None:
        self._work = work
        self.call_id = effect.call_id
        self._command = command
        self._started_at_ms = effect.started_at_ms

    def spawned(self, handle: kept.KeptProcess) -> None:
        work = self._work
        proc = work.processes.add(self.call_id, self._command, handle, self._started_at_ms)
        work.kept_spawned(self, proc)

    def spawn_failed(self, error: OSError) -> None:
        if isinstance(error, kept.StartedAndStopped):
            log.error(
                "the keeper started the command but could not hold it; it was killed",
                extra={"chat_id": self._work.chat_id, "call_id": self.call_id},
            )
            # It ran, if only for an instant: `unknown`.
            self._work.kept_spawn_ended(self, ToolFailed(self.call_id))
            return
        self._work.kept_spawn_ended(self, SpawnFailed(self.call_id, error.strerror or str(error)))

    def spawn_unanswered(self, error: OSError) -> None:
        log.error(
            "the keeper did not answer the spawn (%s): the call ends unknown",
            error.strerror or error,
            extra={"chat_id": self._work.chat_id, "call_id": self.call_id},
        )
        self._work.kept_spawn_ended(self, ToolFailed(self.call_id))
