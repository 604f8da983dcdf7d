"""Scenario `reqresp`: toolwire against the design it replaces, request/response over HTTP/1.1.

Both servers run the same actors in their own processes (`benchmarks.toolwire_server`,
`benchmarks.http_baseline`); this process is the client. Measured side by side:
- trivial calls/s at concurrency 64: toolwire pipelines 64 calls over its one WebSocket; the
  baseline keeps 64 keep-alive connections, each doing `POST /start?wait_ms=...` (one round
  trip per call: the baseline's best case);
- bytes on the wire per trivial call, both directions, counted at the client's sockets;
- time to first output byte of `echo x; sleep 0.3`: toolwire streams it; the baseline client
  polls `GET /output` right after the start and then every N ms (the anchor's agent), and a
  long-polling variant blocks in `GET /output?wait_ms=...` (a stronger baseline than the anchor);
  toolwire and the long-poll are also measured with this client and the server pinned to
  separate cores (`pinned`): unpinned, on this 2-core VM, the client, the server and the new
  shell contend for the cores, and the p50 of both moves between 2 and 8 ms from run to run;
- cancel latency: from sending the cancel of a running `sleep 30` to its canceled result.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import trio

from toolwire.benchmarks.core import (
    BenchContext,
    Comparison,
    Goal,
    Measurement,
    ScenarioResult,
    agent,
    run_side_by_side,
)
from toolwire.benchmarks.http_baseline import HttpClient
from toolwire.benchmarks.procs import CpuMeter, ServerProcess
from toolwire.benchmarks.scenarios.common import TRIVIAL_ARGS, Timed, servers, timed_ws
from toolwire.benchmarks.wire import (
    Codec,
    CountingStream,
    UnexpectedReply,
    WsConn,
    pipelined_calls,
    ws_connect,
)

CONCURRENCY = 64
# The baseline client's polling interval, as a chat server polling a workspace agent would.
POLL_INTERVAL_MS = 50
# A blocking wait long enough never to expire in these runs (the anchor caps it at 5 min).
LONG_WAIT_MS = 30_000


def run(ctx: BenchContext) -> ScenarioResult:
    res = ScenarioResult()
    n_calls = ctx.size(8_000, 256)
    ttfb_trials = ctx.size(30, 3)
    cancel_trials = ctx.size(20, 3)
    sleep_s = ctx.seconds(0.3, 0.05)
    command = f"echo x; sleep {sleep_s:g}"
    repeats = ctx.repeats(3)
    res.params = {
        "concurrency": CONCURRENCY,
        "trivial_calls": n_calls,
        "poll_interval_ms": POLL_INTERVAL_MS,
        "ttfb_command": command,
        "ttfb_trials_per_repeat": ttfb_trials,
        "pinned": "client on the first usable core, the server on the second",
        "cancel_command": "sleep 30",
        "cancel_trials_per_repeat": cancel_trials,
        "repeats": repeats,
    }
    m_tw = res.measurement("toolwire_trivial", "toolwire trivial calls, 64 in flight", "calls/s")
    m_http = res.measurement(
        "http_trivial", "HTTP/1.1 trivial calls, 64 keep-alive connections", "calls/s"
    )
    b_tw = res.measurement(
        "toolwire_bytes", "toolwire bytes per trivial call", "bytes/call", higher_is_better=False
    )
    b_http = res.measurement(
        "http_bytes", "HTTP/1.1 bytes per trivial call", "bytes/call", higher_is_better=False
    )
    t_tw = res.measurement(
        "toolwire_ttfb", "toolwire time to first output byte", "ms", higher_is_better=False
    )
    t_poll = res.measurement(
        "http_poll_ttfb",
        f"HTTP polling every {POLL_INTERVAL_MS} ms: time to first output byte",
        "ms",
        higher_is_better=False,
    )
    t_long = res.measurement(
        "http_longpoll_ttfb",
        "HTTP long-poll: time to first output byte",
        "ms",
        higher_is_better=False,
    )
    t_tw_pin = res.measurement(
        "toolwire_ttfb_pinned",
        "toolwire time to first output byte, pinned",
        "ms",
        higher_is_better=False,
    )
    t_long_pin = res.measurement(
        "http_longpoll_ttfb_pinned",
        "HTTP long-poll: time to first output byte, pinned",
        "ms",
        higher_is_better=False,
    )
    c_tw = res.measurement(
        "toolwire_cancel", "toolwire cancel latency", "ms", higher_is_better=False
    )
    c_http = res.measurement("http_cancel", "HTTP cancel latency", "ms", higher_is_better=False)
    rng = random.Random(6)

    with servers(ctx, "toolwire", "http") as srv:
        http = srv["http"]
        token = srv.token

        def toolwire_trivial(r: int) -> None:
            codec = Codec("json")
            chat = f"reqresp-{r}"
            frames = [
                codec.call(chat, f"c{i}", "read_file", TRIVIAL_ARGS, stream=False)
                for i in range(n_calls)
            ]
            warm = [
                codec.call(chat, f"w{i}", "read_file", TRIVIAL_ARGS, stream=False)
                for i in range(min(n_calls, 256))
            ]
            timed = timed_ws(
                srv["toolwire"],
                lambda c: pipelined_calls(c, codec, frames, CONCURRENCY),
                token=token,
                subprotocol=codec.subprotocol,
                warmup=lambda c: pipelined_calls(c, codec, warm, CONCURRENCY),
            )
            timed.record(m_tw)
            b_tw.add(timed.wire_bytes / timed.ops)

        def http_trivial(r: int) -> None:
            timed = trio.run(_http_trivial, http, token, f"reqresp-http-{r}", n_calls)
            timed.record(m_http)
            b_http.add(timed.wire_bytes / timed.ops)

        def toolwire_ttfb(r: int) -> None:
            tw = srv["toolwire"]
            trio.run(toolwire_first_byte, tw, token, f"ttfb-{r}", command, ttfb_trials, t_tw, rng)

        def http_poll_ttfb(r: int) -> None:
            trio.run(
                _http_ttfb, http, token, f"ttfb-poll-{r}", command, ttfb_trials, t_poll, rng, False
            )

        def http_longpoll_ttfb(r: int) -> None:
            trio.run(
                _http_ttfb, http, token, f"ttfb-long-{r}", command, ttfb_trials, t_long, rng, True
            )

        def toolwire_ttfb_pinned(r: int) -> None:
            tw = srv["toolwire"]
            with pinned(tw.pid):
                trio.run(
                    toolwire_first_byte,
                    tw,
                    token,
                    f"ttfb-pin-{r}",
                    command,
                    ttfb_trials,
                    t_tw_pin,
                    rng,
                )

        def http_longpoll_ttfb_pinned(r: int) -> None:
            with pinned(http.pid):
                trio.run(
                    _http_ttfb,
                    http,
                    token,
                    f"ttfb-long-pin-{r}",
                    command,
                    ttfb_trials,
                    t_long_pin,
                    rng,
                    True,
                )

        def toolwire_cancel(r: int) -> None:
            trio.run(_toolwire_cancel, srv["toolwire"], token, f"cancel-{r}", cancel_trials, c_tw)

        def http_cancel(r: int) -> None:
            trio.run(_http_cancel, http, token, f"cancel-http-{r}", cancel_trials, c_http)

        variants = [
            agent(toolwire_trivial),
            http_trivial,
            agent(toolwire_ttfb),
            http_poll_ttfb,
            http_longpoll_ttfb,
            agent(toolwire_ttfb_pinned),
            http_longpoll_ttfb_pinned,
            agent(toolwire_cancel),
            http_cancel,
        ]
        run_side_by_side(ctx, "reqresp", variants, repeats)

    res.comparisons = [
        Comparison(
            "trivial calls/s at concurrency 64 vs HTTP/1.1 request/response",
            "toolwire_trivial",
            "http_trivial",
            goal=Goal("ratio>=", 3.0, ">= 3x baseline"),
        ),
        Comparison(
            f"time to first output byte (p50, pinned) vs HTTP polling every {POLL_INTERVAL_MS} ms",
            "toolwire_ttfb_pinned",
            "http_poll_ttfb",
            stat="p50",
            goal=Goal("value<", 5.0, "p50 < 5 ms"),
        ),
        Comparison(
            "time to first output byte (p50, unpinned) vs HTTP polling",
            "toolwire_ttfb",
            "http_poll_ttfb",
            stat="p50",
        ),
        Comparison(
            "time to first output byte (p99, unpinned) vs HTTP polling",
            "toolwire_ttfb",
            "http_poll_ttfb",
            stat="p99",
        ),
        Comparison(
            "time to first output byte (p50, pinned) vs HTTP long-poll",
            "toolwire_ttfb_pinned",
            "http_longpoll_ttfb_pinned",
            stat="p50",
        ),
        Comparison(
            "time to first output byte (p50, unpinned) vs HTTP long-poll",
            "toolwire_ttfb",
            "http_longpoll_ttfb",
            stat="p50",
        ),
        Comparison("cancel latency (p50)", "toolwire_cancel", "http_cancel", stat="p50"),
        Comparison("bytes on the wire per trivial call", "toolwire_bytes", "http_bytes"),
    ]
    return res


@contextmanager
def pinned(server_pid: int) -> Iterator[None]:
    """This client on one core, the server (and the processes it spawns meanwhile) on another,
    so that neither waits for the other's core. A machine with one usable core runs unpinned."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        yield
        return
    server_cores = os.sched_getaffinity(server_pid)
    os.sched_setaffinity(0, {cores[0]})
    os.sched_setaffinity(server_pid, {cores[1]})
    try:
        yield
    finally:
        os.sched_setaffinity(0, set(cores))
        os.sched_setaffinity(server_pid, server_cores)


# ---------------------------------------------------------------------------------------------
# HTTP clients


async def _connect_http(server: ServerProcess, token: str) -> tuple[HttpClient, CountingStream]:
    counter = CountingStream(await trio.open_tcp_stream("127.0.0.1", server.port))
    return HttpClient(counter, token), counter


def _start_body(chat: str, call_id: str, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"chat_id": chat, "call_id": call_id, "tool": tool, "args": args}


def _check(status: int, body: Any) -> Any:
    if status != 200:
        raise UnexpectedReply(f"HTTP {status}: {body}")
    return body


async def _http_trivial(server: ServerProcess, token: str, chat: str, n_calls: int) -> Timed:
    clients = [await _connect_http(server, token) for _ in range(CONCURRENCY)]
    per_worker = [list(range(k, n_calls, CONCURRENCY)) for k in range(CONCURRENCY)]

    async def worker(client: HttpClient, ids: list[int], prefix: str) -> None:
        for i in ids:
            body = _check(
                *await client.request(
                    "POST",
                    f"/start?wait_ms={LONG_WAIT_MS}",
                    _start_body(chat, f"{prefix}{i}", "read_file", TRIVIAL_ARGS),
                )
            )
            if not body["done"] or body["result"]["outcome"] != "completed":
                raise UnexpectedReply(f"trivial call ended {body}")

    try:
        async with trio.open_nursery() as nursery:  # warm-up: a few calls per connection
            for k, (client, _) in enumerate(clients):
                nursery.start_soon(worker, client, per_worker[k][:4], "w")
        for _, counter in clients:
            counter.reset()
        meter = CpuMeter(server.pid)
        meter.start()
        t0 = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for k, (client, _) in enumerate(clients):
                nursery.start_soon(worker, client, per_worker[k], "c")
        seconds = time.perf_counter() - t0
        meter.stop()
    finally:
        for _, counter in clients:
            await counter.aclose()
    wire = sum(counter.total for _, counter in clients)
    return Timed(n_calls, seconds, meter.client_s, meter.server_s, wire, meter.server_threads)


async def _http_ttfb(
    server: ServerProcess,
    token: str,
    chat: str,
    command: str,
    trials: int,
    m: Measurement,
    rng: random.Random,
    long_poll: bool,
) -> None:
    client, counter = await _connect_http(server, token)
    samples: list[float] = []
    try:
        for i in range(trials):
            await trio.sleep(rng.uniform(0.0, 0.02))
            call_id = f"t{i}"
            t0 = time.perf_counter()
            _check(
                *await client.request(
                    "POST",
                    "/start?wait_ms=0",
                    _start_body(chat, call_id, "execute", {"command": command}),
                )
            )
            wait_ms = LONG_WAIT_MS if long_poll else 0
            target = f"/output?chat_id={chat}&call_id={call_id}&offset=0&wait_ms={wait_ms}"
            while True:
                body = _check(*await client.request("GET", target))
                if body["data"]:
                    samples.append((time.perf_counter() - t0) * 1000)
                    break
                if body["done"]:
                    raise UnexpectedReply(f"{command!r} ended without output")
                if not long_poll:
                    await trio.sleep(POLL_INTERVAL_MS / 1000)
    finally:
        await counter.aclose()
    m.add_samples(samples)
    m.add(statistics.median(samples))


async def _http_cancel(
    server: ServerProcess, token: str, chat: str, trials: int, m: Measurement
) -> None:
    client, counter = await _connect_http(server, token)
    samples: list[float] = []
    try:
        for i in range(trials):
            call_id = f"s{i}"
            body = _start_body(chat, call_id, "execute", {"command": "sleep 30"})
            _check(*await client.request("POST", "/start?wait_ms=0", body))
            target = f"/output?chat_id={chat}&call_id={call_id}&offset=0&wait_ms=0"
            # Polling is the design under test here.
            while not _check(*await client.request("GET", target))["started"]:  # noqa: ASYNC110
                await trio.sleep(0.005)
            await trio.sleep(0.01)
            t0 = time.perf_counter()
            reply = _check(
                *await client.request("POST", "/cancel", {"chat_id": chat, "call_ids": [call_id]})
            )
            samples.append((time.perf_counter() - t0) * 1000)
            outcome = reply["results"][0]["result"]["outcome"]
            if outcome != "canceled":
                raise UnexpectedReply(f"cancel of a running sleep ended {outcome}")
    finally:
        await counter.aclose()
    m.add_samples(samples)
    m.add(statistics.median(samples))


# ---------------------------------------------------------------------------------------------
# toolwire clients


async def toolwire_first_byte(
    server: ServerProcess,
    token: str,
    chat: str,
    command: str,
    trials: int,
    m: Measurement,
    rng: random.Random,
) -> None:
    codec = Codec("json")
    samples: list[float] = []
    async with ws_connect(server.port, token=token, subprotocol=codec.subprotocol) as conn:
        for i in range(trials):
            await trio.sleep(rng.uniform(0.0, 0.02))
            call_id = f"t{i}"
            frame = codec.call(chat, call_id, "execute", {"command": command}, stream=True)
            t0 = time.perf_counter()
            await conn.ws.send_message(frame)
            while True:
                message = codec.decode(await conn.ws.get_message())
                if message.call_id != call_id:
                    continue  # the end of an earlier trial
                if message.type == "output":
                    samples.append((time.perf_counter() - t0) * 1000)
                    break
                if message.type in ("result", "error"):
                    raise UnexpectedReply(f"{command!r} ended without output: {message}")
    m.add_samples(samples)
    m.add(statistics.median(samples))


async def _toolwire_cancel(
    server: ServerProcess, token: str, chat: str, trials: int, m: Measurement
) -> None:
    codec = Codec("json")
    samples: list[float] = []
    async with ws_connect(server.port, token=token, subprotocol=codec.subprotocol) as conn:
        for i in range(trials):
            call_id = f"s{i}"
            await conn.ws.send_message(
                codec.call(chat, call_id, "execute", {"command": "sleep 30"}, stream=True)
            )
            await _until(conn, codec, call_id, "started")
            await trio.sleep(0.01)
            t0 = time.perf_counter()
            await conn.ws.send_message(codec.cancel(chat, [call_id]))
            reply = await _until(conn, codec, call_id, "cancel_result")
            samples.append((time.perf_counter() - t0) * 1000)
            outcome = reply.result.get("outcome") if isinstance(reply.result, dict) else None
            if outcome != "canceled":
                raise UnexpectedReply(f"cancel of a running sleep ended {outcome}")
    m.add_samples(samples)
    m.add(statistics.median(samples))


async def _until(conn: WsConn, codec: Codec, call_id: str, kind: str) -> Any:
    while True:
        message = codec.decode(await conn.ws.get_message())
        if message.type == "error":
            raise UnexpectedReply(f"error {message.code}: {message.message}")
        if message.type == kind and message.call_id == call_id:
            return message
