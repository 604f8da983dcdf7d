"""What `toolwire serve` does to its own process for the event loop's sake
(actors/loop_priority.py), each in an interpreter of its own: the settings are process-wide."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_PROBE = """
import gc, json, sys, time
import toolwire.cli.serve  # what serve has imported when it calls these
from toolwire.actors.loop_priority import favour_the_event_loop, keep_the_collector_off_the_start

def full_collection_walks():
    return len(gc.get_objects())

before = full_collection_walks()
favour_the_event_loop()
keep_the_collector_off_the_start()
after = full_collection_walks()

class Node:
    pass

a, b = Node(), Node()
a.other, b.other = b, a  # a cycle made after the start
del a, b
print(json.dumps({"before": before, "after": after, "frozen": gc.get_freeze_count(),
                  "collected": gc.collect(), "switch": sys.getswitchinterval()}))
"""


def test_the_start_is_frozen_out_of_the_collector_and_later_cycles_still_go() -> None:
    """Every object the start made is out of a full collection's walk (tens of thousands:
    milliseconds of the loop's time at each one), and a cycle made afterwards is collected."""
    done = subprocess.run(
        [sys.executable, "-c", _PROBE], cwd=ROOT, capture_output=True, text=True, check=True
    )
    got = json.loads(done.stdout)
    assert got["before"] > 20_000 and got["frozen"] >= got["before"] * 0.9, got
    assert got["after"] < 500, got  # what the collector still walks: next to nothing
    assert got["collected"] >= 2, got  # the two nodes of the new cycle (and their dicts)
    assert got["switch"] == 0.001, got
