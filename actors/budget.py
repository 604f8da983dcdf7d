"""The agent-wide bounds every chat shares (issue 27, defect 5): tool-call records held in
memory and processes running, over all chats. Pure: no trio, no I/O.

Per-chat limits alone let a client spread its load: 64 processes per chat but any number of
chats, records of 15,000 chats with no cap at all. Each chat keeps these counts up to date
where its records and process slots come and go (its `RecordTable`, `ChatState._hold_slot` and
`_free_slot`) and checks them before it admits anything that would go past a limit, so a
request over a limit is refused (`over_limit`, naming the limit) and changes nothing, and the
agent never runs out of memory or processes instead.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class AgentBudget:
    """What the chats of one agent hold together, and how much they may."""

    max_records: int
    max_processes: int
    records: int = 0  # records held in memory, every chat's (tombstones and restored included)
    processes: int = 0  # processes running or being started, every chat's

    def __post_init__(self) -> None:
        for name in ("max_records", "max_processes"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"{name} must be an integer >= 1, not {value!r}")
