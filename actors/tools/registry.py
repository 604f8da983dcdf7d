"""Every tool of the agent, each one `ToolDef`: its args, their checks, how it runs, its role in
a turn, its effect and what a model is told about it. Everything else reads it from here: the
chat's dispatch (actors/chat_work.py, actors/runners.py), the turn planner's reservations, the
welcome's tool list, `describe_tools` (PROTOCOL.md 10.3), the schema and the docs.

Adding a tool is its module (args Struct and function) and one entry in `TOOLS`; an entry
missing a piece is a TypeError at import and a mypy error, and the checks at the bottom of this
module refuse one whose args or description break the rules of 10.3.

Pure: no trio. The runs of file tools are the functions themselves (synchronous, trio-free);
process tools name a `ProcessOp`, which actors/runners.py and actors/chat_work.py carry out
against the chat's process table (code that needs trio), matching every op (mypy checks that
the match is exhaustive).
"""

from __future__ import annotations

import enum
import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Protocol, TypeAlias, TypeVar

import msgspec

from toolwire.actors import planner
from toolwire.actors.hidden_paths import HiddenPaths
from toolwire.actors.planner import Reserves
from toolwire.actors.results import ToolReport, ToolwireError
from toolwire.actors.tools import execute, files, list_dir
from toolwire.actors.tools.execute import ExecuteArgs
from toolwire.actors.tools.process_args import (
    ProcessInputArgs,
    ProcessListArgs,
    ProcessOutputArgs,
    ProcessResizeArgs,
    ProcessSignalArgs,
    check_process_id,
)

A = TypeVar("A", bound=msgspec.Struct)
A_contra = TypeVar("A_contra", bound=msgspec.Struct, contravariant=True)


class FileWork(Protocol[A_contra]):
    """A file tool's work: (workspace, args), and the agent's own files it must not touch."""

    def __call__(self, workspace: str, args: A_contra, /, *, hidden: HiddenPaths) -> ToolReport: ...


class StoppableFileWork(Protocol[A_contra]):
    """File work that asks `should_stop` between blocks of work."""

    def __call__(
        self,
        workspace: str,
        args: A_contra,
        should_stop: Callable[[], bool],
        /,
        *,
        hidden: HiddenPaths,
    ) -> ToolReport: ...


class ToolKind(enum.Enum):
    EXECUTE = "execute"  # spawns a process the chat owns
    PROCESS = "process"  # works on the chat's process table
    INLINE = "inline"  # a short synchronous read, run on the event loop
    # A file operation that may take long: a worker thread, so the loop (every chat,
    # connection and keepalive of the agent) never waits for it. A tree walk; a write of up
    # to 16 MiB with two fsyncs, which a busy disk can make take seconds whatever its size.
    THREAD = "thread"


@dataclass(frozen=True, slots=True)
class OnLoop(Generic[A]):
    """A short read of files, run right on the event loop within the request that starts it."""

    run: FileWork[A]


@dataclass(frozen=True, slots=True)
class OnThread(Generic[A]):
    """File work that may take long, on a worker thread; a cancel waits for its real end.
    `below_the_loop`: on a thread of its own at a lower OS priority than the event loop's
    (actors/worker_priority.py), for work that keeps a CPU busy for long (big writes)."""

    run: FileWork[A]
    below_the_loop: bool = False


@dataclass(frozen=True, slots=True)
class StoppableOnThread(Generic[A]):
    """File work on a worker thread that a cancel stops: `run` asks `should_stop` between
    blocks of work and raises `files.SearchStopped` once it says yes (the call ends
    `canceled`); one that ended first keeps its real result."""

    run: StoppableFileWork[A]


class ProcessOp(enum.Enum):
    """Work on the chat's process table (actors/runners.py carries each out)."""

    OUTPUT = "output"  # a wait a cancel can end, as a task
    SIGNAL = "signal"  # on the loop
    LIST = "list"  # on the loop
    INPUT = "input"  # joins the process's input queue at once, then a task a cancel can end
    RESIZE = "resize"  # on the loop


class Spawns(enum.Enum):
    """`execute`: the chat spawns a command (no RunTool; see ChatState's Spawn effect)."""

    COMMAND = "command"


Work: TypeAlias = OnLoop[A] | OnThread[A] | StoppableOnThread[A] | ProcessOp | Spawns
Effect = Literal["read", "write", "process"]

# PROTOCOL.md 10.3: a description is at most this many characters.
MAX_DESCRIPTION_CHARS = 1000


def no_check(args: msgspec.Struct) -> None:
    """For args whose Struct says everything (process_list takes none)."""


@dataclass(frozen=True, slots=True)
class ToolDef:
    """One tool. Built by `tool_def`, whose type parameter ties the args type to its check
    and run (mypy refuses an entry whose run takes other args)."""

    name: str
    args_type: type[msgspec.Struct]
    # What the Struct's shape cannot say (a NUL in a path, a non-printable process id);
    # raises ValueError naming the field as `args.x`, and the call is `bad_args`.
    check: Callable[[Any], None]
    run: Work[Any]
    reserves: Reserves  # its role in a turn (actors/planner.py)
    # PROTOCOL.md 10.3: "read" changes nothing, "write" changes files, "process" starts,
    # signals or types into processes.
    effect: Effect
    description: str  # for a model (10.3): what, when, what it returns, its limits

    # Derived from `run` and `effect` once, when the entry is made: ChatState asks them
    # several times on every call (a property ran its `match` five times a trivial call).
    kind: ToolKind = field(init=False)
    # A wait a cancel can end (`process_output`, `process_input`), or file work that stops
    # when told to (a search): it runs as a task, and a cancel ends it `canceled`.
    stoppable: bool = field(init=False)
    # Changes nothing outside the agent: no start row is journaled before it runs (there is
    # no effect a crash could forget); its result is journaled before its reply like any
    # other.
    read_only: bool = field(init=False)
    # Short enough to run right on the event loop, within the input that starts it.
    runs_on_loop: bool = field(init=False)

    def __post_init__(self) -> None:
        match self.run:
            case OnLoop():
                kind = ToolKind.INLINE
            case OnThread() | StoppableOnThread():
                kind = ToolKind.THREAD
            case ProcessOp():
                kind = ToolKind.PROCESS
            case Spawns():
                kind = ToolKind.EXECUTE
        stoppable = isinstance(self.run, StoppableOnThread) or self.run in (
            ProcessOp.OUTPUT,
            ProcessOp.INPUT,
        )
        on_loop = kind is ToolKind.INLINE or (kind is ToolKind.PROCESS and not stoppable)
        # (Frozen: the derived fields are set the way dataclasses' own __init__ sets fields.)
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "stoppable", stoppable)
        object.__setattr__(self, "read_only", self.effect == "read")
        object.__setattr__(self, "runs_on_loop", on_loop)


def tool_def(
    name: str,
    args_type: type[A],
    check: Callable[[A], None],
    run: Work[A],
    reserves: Reserves,
    effect: Effect,
    description: str,
) -> ToolDef:
    return ToolDef(name, args_type, check, run, reserves, effect, description)


_OUTPUT_LIMITS = (
    "A result's output keeps its head and tail within result_output_bytes (default 64 KiB: the "
    "first 16 KiB and the last 48 KiB) with a line saying how many bytes were omitted."
)

_TOOLS: tuple[ToolDef, ...] = (
    tool_def(
        "execute",
        ExecuteArgs,
        execute.check_args,
        Spawns.COMMAND,
        planner.BARRIER,
        "process",
        "Run a shell command (/bin/sh -c, or bash) in the workspace, in a process group of its "
        "own, stdout and stderr merged. Use it to build, test, run programs and inspect the "
        "system; prefer the file tools for reading, writing and searching files. Returns "
        "exit_code, signal and process_id, with the command's output. " + _OUTPUT_LIMITS + " "
        "The call's timeout_ms ends the wait, not the command: it goes on running (read it "
        "with process_output, stop it with process_signal); kill_after_ms stops it. With stdin "
        "or pty the command reads what process_input sends.",
    ),
    tool_def(
        "process_output",
        ProcessOutputArgs,
        check_process_id,
        ProcessOp.OUTPUT,
        planner.NOTHING,
        "read",
        "Read the state and retained output of a process this chat started with execute: "
        "running, exit_code, signal, timed_out, canceled. With wait, first wait for it to exit, "
        "up to wait_ms, capped at max_wait_ms (default 300000). Use it after a timed-out or "
        "background command. Retention keeps the first 64 KiB and the newest bytes of a running "
        "process; " + _OUTPUT_LIMITS,
    ),
    tool_def(
        "process_signal",
        ProcessSignalArgs,
        check_process_id,
        ProcessOp.SIGNAL,
        planner.BARRIER,
        "process",
        "Send a signal (SIGINT, SIGTERM, SIGKILL, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2) to the "
        "whole process group of a command this chat started. Use SIGINT or SIGTERM to stop a "
        "command, SIGKILL if it ignores them. Returns delivered: false when the command had "
        "already exited.",
    ),
    tool_def(
        "process_list",
        ProcessListArgs,
        no_check,
        ProcessOp.LIST,
        planner.NOTHING,
        "read",
        "List the processes this chat started with execute, running or exited recently: "
        "process_id, command, running, exit_code, started_at and exited_at (unix ms). Use it to "
        "find a background command's process_id.",
    ),
    tool_def(
        "process_input",
        ProcessInputArgs,
        check_process_id,
        ProcessOp.INPUT,
        planner.BARRIER,
        "process",
        "Type into a running command started with stdin or pty: writes data once (UTF-8; eof "
        "closes its input, on a terminal it sends the EOF character), then waits up to wait_ms "
        "(capped at max_wait_ms) for it to print or exit. Returns written, stdin_offset, "
        "output_offset, running and exit_code, with the output printed since the write. "
        + _OUTPUT_LIMITS
        + " Fails, writing nothing, when the process has no open input or has exited.",
    ),
    tool_def(
        "process_resize",
        ProcessResizeArgs,
        check_process_id,
        ProcessOp.RESIZE,
        planner.BARRIER,
        "process",
        "Resize the terminal of a command started with pty (its process group gets SIGWINCH). "
        "Returns rows and cols. Fails for a process without a terminal.",
    ),
    tool_def(
        "read_file",
        files.ReadFileArgs,
        files.check_read_file,
        OnLoop(files.read_checked_file),  # checked by parse_args when the call is admitted
        planner.reader(),
        "read",
        "Read a UTF-8 text file of the workspace (relative paths are against the workspace). "
        "Returns content, lines and total_lines, and sha256 of the file. offset (1-based line) "
        "and limit (lines) read a part; at most 2000 lines and 256 KiB per call, and the text "
        "says which offset to ask for next. Fails for a missing file, a directory or a binary "
        "file. Use it rather than cat in execute.",
    ),
    tool_def(
        "write_file",
        files.WriteFileArgs,
        files.check_write_file,
        OnThread(files.write_file, below_the_loop=True),
        planner.writer(),
        "write",
        "Create or replace a whole file with content (UTF-8), creating missing parent "
        "directories. The write is atomic: a reader sees the old file or the new one, never "
        'half. expected_sha256 makes it conditional (the file\'s current SHA-256, or "absent" '
        "for a new file): if the file changed, nothing is written and the call fails. Returns "
        "bytes written. For a small change to a big file, edit_files is cheaper.",
    ),
    tool_def(
        "edit_files",
        files.EditFilesArgs,
        files.check_edit_files,
        OnThread(files.edit_files, below_the_loop=True),
        planner.writer(each_in="files"),
        "write",
        "Replace exact text in one or more files, all or nothing: each edit's old text must "
        "occur exactly once in its file (or set replace_all), else no file changes and the call "
        "fails, naming the edit. Edits of one file apply in order. Returns per file the number "
        "of replacements. Read the file first to copy old exactly, whitespace included.",
    ),
    tool_def(
        "search_files",
        files.SearchFilesArgs,
        files.check_search_files,
        StoppableOnThread(files.search_files_until),
        planner.reader(default="."),
        "read",
        "Search text files for a regular expression (RE2 syntax, matched line by line), in a "
        "file or under a directory (default the workspace), optionally only files matching a "
        "glob. Returns matches {path, line, text} in path order, and truncated. Skips binary "
        "files, .git and other VCS directories, and pseudo filesystems such as /proc. Stops at "
        "500 matches or after 30 s (truncated, with the text saying so); lines are cut to 500 "
        "characters.",
    ),
    tool_def(
        "list_dir",
        list_dir.ListDirArgs,
        list_dir.check_args,
        OnThread(list_dir.list_dir),
        planner.reader(default="."),
        "read",
        list_dir.DESCRIPTION,
    ),
)

TOOLS: dict[str, ToolDef] = {tool.name: tool for tool in _TOOLS}
TOOL_NAMES: list[str] = list(TOOLS)


def lookup(name: str) -> ToolDef:
    tool = TOOLS.get(name)
    if tool is None:
        raise ToolwireError(
            "unknown_tool", f"unknown tool {name!r}; this agent has: {', '.join(TOOL_NAMES)}"
        )
    return tool


def reserves_of(name: str) -> Reserves:
    """A tool's role in a turn; a tool the agent does not know is a barrier (PROTOCOL.md 5.6)."""
    tool = TOOLS.get(name)
    return planner.BARRIER if tool is None else tool.reserves


def parse_shape(tool: ToolDef, args: Any) -> msgspec.Struct:
    """Args against the tool's Struct alone: exactly what its `input_schema` says (PROTOCOL.md
    10.3). ToolwireError(bad_args) names the field, an unknown one included."""
    if not isinstance(args, dict):
        raise ToolwireError("bad_args", f"{tool.name}: args must be an object")
    try:
        return msgspec.convert(_whole_numbers(args), tool.args_type)
    except msgspec.ValidationError as exc:
        raise ToolwireError("bad_args", f"{tool.name}: {_args_path(tool, str(exc))}") from None


def parse_args(tool: ToolDef, args: Any) -> msgspec.Struct:
    """Check args against the tool's schema and its `check`; ToolwireError(bad_args) names
    the field."""
    parsed = parse_shape(tool, args)
    try:
        tool.check(parsed)
    except ValueError as exc:
        raise ToolwireError("bad_args", f"{tool.name}: {exc}") from None
    return parsed


def _whole_numbers(value: Any) -> Any:
    """JSON Schema's "integer" is any number with a zero fraction, 1.0 included (a JSON encoder
    may write one so); msgspec takes only an int. So a float that is a whole number becomes
    that int, and the schema stays exact. Copies only what holds such a float."""
    if isinstance(value, float):
        return int(value) if value.is_integer() else value
    # Plain loops, not `any()` over a generator: every call's args pass here, and most hold
    # nothing to copy (a generator is a frame resumed per value).
    if isinstance(value, dict):
        for v in value.values():
            if isinstance(v, _MAY_HOLD_FLOATS):
                return {k: _whole_numbers(v) for k, v in value.items()}
        return value
    if isinstance(value, list):
        for v in value:
            if isinstance(v, _MAY_HOLD_FLOATS):
                return [_whole_numbers(v) for v in value]
        return value
    return value


_MAY_HOLD_FLOATS = (float, dict, list)


def _args_path(tool: ToolDef, message: str) -> str:
    # msgspec names the path from the root of what it converted: `$.cwd`; say `args.cwd`. An
    # unknown field is named with its own path, `args.files[0].pth`, and with the names the
    # object there takes, so a model that misspelled one sees the right spelling.
    prefix = "Object contains unknown field `"
    if message.startswith(prefix):
        name, _, rest = message[len(prefix) :].partition("`")
        at = rest.partition(" - at `$")[2].rstrip("`")
        known = _property_names(_schema_of(tool.args_type), at)
        takes = f" (it takes: {', '.join(known)})" if known else " (it takes none)"
        return f"`args{at}.{name}` is not an argument of this tool{takes}"
    return message.replace("`$.", "`args.").replace("`$`", "`args`")


def _property_names(schema: dict[str, Any], at: str) -> list[str]:
    """The property names of the object at `at` (msgspec's path: `.files[0].edits[1]`)."""
    node: Any = schema
    for step in re.findall(r"\.(\w+)|\[\d+\]", at):
        node = node["properties"][step] if step else node["items"]
        while "anyOf" in node:  # an optional object: its object option
            node = next(option for option in node["anyOf"] if option.get("type") != "null")
    return list(node.get("properties", {}))


def input_schema(tool: ToolDef) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a tool's args as PROTOCOL.md 10.3 gives it to a
    model: self-contained (every `$ref` inlined), `type: object`, `additionalProperties:
    false`, `required` listed, a description on every property. Exactly what `parse_shape`
    takes (tests/test_tool_schemas.py checks both ways). A new dict on every call."""
    schema: dict[str, Any] = _inline(_schema_of(tool.args_type))
    return schema


@functools.cache
def _schema_of(args_type: type[msgspec.Struct]) -> dict[str, Any]:
    schema = msgspec.json.schema(args_type)
    defs = schema.pop("$defs", {})
    tidy: dict[str, Any] = _tidy(_resolve(schema, defs), defs)
    return tidy


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    if ref is None:
        return node
    found: dict[str, Any] = defs[ref.rsplit("/", 1)[1]]
    return found


def _tidy(node: Any, defs: dict[str, Any]) -> Any:
    """`node` with every `$ref` replaced by what it names, structs' titles dropped (a model
    needs the field names, not the Python class names) and `required` always present."""
    if isinstance(node, list):
        return [_tidy(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    node = _resolve(node, defs)
    out = {key: _tidy(value, defs) for key, value in node.items() if key != "title"}
    if out.get("type") == "object" and "properties" in out:
        out.setdefault("required", [])
        out.setdefault("additionalProperties", False)
    return out


def _inline(node: Any) -> Any:
    # A deep copy, so that a caller changing its schema never changes the cached one.
    if isinstance(node, dict):
        return {key: _inline(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_inline(item) for item in node]
    return node


def check_registry(tools: tuple[ToolDef, ...]) -> None:
    """The rules of PROTOCOL.md 10.3 that no type says, checked as the module loads: a tool
    that breaks one fails at import, not when a model asks."""
    for tool in tools:
        if not tool.name or not tool.description:
            raise TypeError(f"tool {tool.name!r}: a name and a description are needed")
        if len(tool.description) > MAX_DESCRIPTION_CHARS:
            raise TypeError(
                f"tool {tool.name}: description of {len(tool.description)} characters,"
                f" over {MAX_DESCRIPTION_CHARS}"
            )
        if not tool.args_type.__struct_config__.forbid_unknown_fields:
            raise TypeError(f"tool {tool.name}: its args must forbid unknown fields")
        for where, prop in _properties(_schema_of(tool.args_type), "args"):
            if not prop.get("description"):
                raise TypeError(f"tool {tool.name}: `{where}` has no description")
    if len({tool.name for tool in tools}) != len(tools):
        raise TypeError("two tools share a name")


def _properties(node: Any, where: str) -> list[tuple[str, dict[str, Any]]]:
    """Every property of every object of a schema, with its path (`args.pty.rows`)."""
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        for name, prop in node.get("properties", {}).items():
            found.append((f"{where}.{name}", prop))
            found.extend(_properties(prop, f"{where}.{name}"))
        for key in ("items", "anyOf", "additionalProperties"):
            sub = node.get(key)
            for item in sub if isinstance(sub, list) else [sub]:
                found.extend(_properties(item, where))
    return found


check_registry(_TOOLS)
