"""Which thread ran a SQLite journal's commits, seen through its public `commit_statements`
seam (actors/journal.py): the loop's own or the writer thread."""

from __future__ import annotations

import sqlite3
import threading

from toolwire.actors.journal import CommitBatch, CommitStatements, run_commit_statements


class CommitThreads:
    """The journal's real statements, counting the commits that ran on the thread that made
    this (the trio loop's) and those that ran on another (the writer thread)."""

    def __init__(self, statements: CommitStatements = run_commit_statements) -> None:
        self._statements = statements
        self._loop_thread = threading.get_ident()
        self.on_loop = 0
        self.on_thread = 0

    def __call__(self, db: sqlite3.Connection, batch: CommitBatch) -> None:
        self._statements(db, batch)
        if threading.get_ident() == self._loop_thread:
            self.on_loop += 1
        else:
            self.on_thread += 1
