"""What `toolwire serve` does to its own process for the event loop's sake
(actors/loop_priority.py), each in an interpreter of its own: the settings are process-wide.
And that a chat the agent forgets is freed by reference counting, not left to the cyclic
collector, through a real server."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import trio

from tests.conftest import MakeServer
from toolwire.actors.chat import ChatActor
from toolwire.actors.context import Limits

ROOT = Path(__file__).resolve().parent.parent

_START = """
import gc, json, sys
import toolwire.cli.serve  # what serve has imported when it calls these
from toolwire.actors.loop_priority import favour_the_event_loop, fold_survivors_out_of_the_collector

def full_collection_walks():
    return len(gc.get_objects())

before = full_collection_walks()
favour_the_event_loop()
fold_survivors_out_of_the_collector()
after = full_collection_walks()

class Node:
    pass

a, b = Node(), Node()
a.other, b.other = b, a  # a cycle made after the start
del a, b
collected = gc.collect()
kept = [[i] for i in range(20_000)]  # long-lived: what chats hold
frozen_before = gc.get_freeze_count()
gc.collect()  # a full collection, as the interpreter runs them
print(json.dumps({"before": before, "after": after, "frozen": frozen_before,
                  "collected": collected, "switch": sys.getswitchinterval(),
                  "folded": gc.get_freeze_count() - frozen_before,
                  "walked_after_fold": full_collection_walks(),
                  "threshold": gc.get_threshold()}))
"""


def run_probe(source: str) -> Any:
    done = subprocess.run(
        [sys.executable, "-c", source], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout)


def test_the_start_and_every_full_collections_survivors_are_frozen_and_new_cycles_go() -> None:
    """Every object the start made is out of a full collection's walk (tens of thousands:
    milliseconds of the loop's time at each one), a cycle made afterwards is collected, and
    what a later full collection leaves (20,000 live lists here) is frozen too, so the next one
    walks only what came after it."""
    got = run_probe(_START)
    assert got["before"] > 20_000 and got["frozen"] >= got["before"] * 0.9, got
    assert got["after"] < 500, got  # what the collector still walks: next to nothing
    assert got["collected"] >= 2, got  # the two nodes of the new cycle (and their dicts)
    assert got["folded"] >= 20_000, got
    assert got["walked_after_fold"] < 500, got
    assert got["threshold"][2] == 2, got
    assert got["switch"] == 0.001, got


# A load that never stops: chats made in batches, each a cycle (as a chat's objects refer to
# each other; two tracked objects, the chat and its dict), each batch alive while WINDOW more
# come, so that it outlives full
# collections and is frozen, then forgotten. Only the interpreter's own collections run: no
# gc.collect() after the start. Small bounds, so that the thaw comes within seconds.
_SUSTAINED = """
import gc, json, weakref
from toolwire.actors.loop_priority import FoldedCollections, fold_survivors_out_of_the_collector

folded = FoldedCollections(growth=2, floor=20_000, count_every_s=0.0)
fold_survivors_out_of_the_collector(folded)
start_frozen = gc.get_freeze_count()

class Chat:
    def __init__(self):
        self.state = {"chat": self}  # a cycle: only the collector frees it

WINDOW = 20
first = []
window = []
peak = 0
seen_frozen = False
for batch in range(300):
    chats = [Chat() for _ in range(1_000)]
    if batch == 0:
        first = [weakref.ref(c) for c in chats[:100]]
        probe = chats[0]
    window.append(chats)
    if len(window) > WINDOW:
        window.pop(0)
    if batch < WINDOW and not seen_frozen:
        # frozen while alive: tracked, yet in no generation a collection walks
        walked = {id(o) for o in gc.get_objects()}
        seen_frozen = gc.is_tracked(probe) and id(probe) not in walked
        del walked
    if batch == WINDOW - 1:
        del probe  # its batch goes with the next one
    del chats
    peak = max(peak, gc.get_freeze_count())
window.clear()
print(json.dumps({"start_frozen": start_frozen, "peak_frozen": peak,
                  "first_alive": sum(r() is not None for r in first),
                  "seen_frozen": seen_frozen, "folds": folded.folds, "thaws": folded.thaws}))
"""


def test_forgotten_cycles_that_were_frozen_are_collected_and_the_frozen_heap_stays_bounded() -> (
    None
):
    """Under a load that never stops, what was frozen while alive and then forgotten is
    collected (the thaw lets a full collection walk it again), and the frozen heap never holds
    much more than `growth` times the larger of the floor and what lives: 300,000 cycles made,
    at most 21,000 alive at once."""
    got = run_probe(_SUSTAINED)
    assert got["seen_frozen"], got  # the forgotten chats had been moved out of the collector
    assert got["first_alive"] == 0, got  # ... and were collected all the same
    assert got["thaws"] >= 2 and got["folds"] > got["thaws"], got
    # A thaw comes once the frozen heap is over growth x max(what the last thaw left, floor);
    # what the last thaw left is at most the start's objects and the live chats (two objects
    # each), and one fold past the mark adds at most the live chats again.
    live = 2 * 21_000
    bound = 2 * max(got["start_frozen"] + live, 20_000) + live
    assert got["peak_frozen"] <= bound, got


async def test_a_forgotten_chat_is_freed_by_reference_counting(make_server: MakeServer) -> None:
    """Chats of one finished call each, forgotten by the sweeper (5.4), leave nothing for the
    cyclic collector: with the survivors of every full collection frozen, a cycle among a
    forgotten chat's objects would wait for the next walk of the whole frozen heap."""
    server = await make_server(limits=Limits(forget_after_s=0))
    (server.workspace / "f.txt").write_text("hello\n")
    chat_ids = {f"c{i}" for i in range(20)}
    with trio.fail_after(30):
        async with server.connect() as conn:
            for chat_id in sorted(chat_ids):
                done = await conn.call(chat_id, "x", "read_file", {"path": "f.txt"})
                assert done["outcome"] == "completed", done
    await trio.sleep(0.01)  # forget_after_s=0: anything older than now goes

    def chats_in_memory() -> set[str]:
        return {o.chat_id for o in gc.get_objects() if isinstance(o, ChatActor)} & chat_ids

    gc.collect()  # other tests' garbage: only what this test makes is looked at
    gc.disable()
    try:
        assert chats_in_memory() == chat_ids
        server.agent.sweep()
        assert not chat_ids & set(server.agent.chats)
        assert chats_in_memory() == set()  # freed, with the collector off
    finally:
        gc.enable()
