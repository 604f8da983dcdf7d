"""`write_file` and `edit_files` under a sandbox (PROTOCOL.md 10.4, last point): the agent writes
these files itself, so it checks them against the call's filesystem point itself, on any kernel,
after resolving symlinks (a link in the workspace to a file outside it is outside)."""

from __future__ import annotations

from toolwire.actors.results import Outcome, ToolReport
from toolwire.actors.sandbox import Enforcement
from toolwire.actors.sandbox_policy import TEXT_OUTSIDE, SandboxPolicy
from toolwire.actors.tools import files as file_tools


def refused_write(
    enforcement: Enforcement, policy: SandboxPolicy, workspace: str, args: object
) -> ToolReport | None:
    """The `failed` report of a `write_file` or `edit_files` that would write outside `policy`,
    naming the first such path as given (nothing is written); None for any other call."""
    if isinstance(args, file_tools.WriteFileArgs):
        paths = [args.path]
    elif isinstance(args, file_tools.EditFilesArgs):
        paths = [entry.path for entry in args.files]
    else:
        return None
    path = enforcement.outside(policy, workspace, paths)
    if path is None:
        return None
    return ToolReport(
        outcome=Outcome.FAILED, text=TEXT_OUTSIDE.format(path=path), data={"path": path}
    )
