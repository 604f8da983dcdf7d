"""Scenario `transport`: toolwire's trivial calls against the raw WebSocket echo limit.

The servers run in their own processes; this process is the client. Two echo servers return
200-byte messages over one connection, one at a time (ping-pong) and pipelined with a window of
64 in flight: stock trio-websocket, and the best echo this machine does in Python (wsproto on a
raw trio stream with toolwire's write coalescing, `benchmarks/wsproto_echo_server.py`). toolwire
answers trivial calls (`read_file` of a 300-byte file, `stream: false`) over one connection,
pipelined with the same window of 64 and one at a time, on `toolwire serve`'s defaults (SQLite
journal, sync full); the memory journal is measured beside it. A toolwire call is at least
three messages (`call`, `accepted`, `result`), an echo is two. The pipelined JSON calls also run
against a second agent on the same defaults with its operator's counters off (`--no-metrics`):
what counting for `/metrics` costs the hot path. And once more with a client that encodes and
decodes JSON with the standard library's `json` module instead of msgspec, as a chat server
without msgspec would (the client shares the 2 cores with the agent, so its cost shows).
"""

from __future__ import annotations

from toolwire.benchmarks.core import (
    BenchContext,
    Comparison,
    Goal,
    ScenarioResult,
    agent,
    run_side_by_side,
)
from toolwire.benchmarks.scenarios.common import TRIVIAL_ARGS, servers, timed_ws
from toolwire.benchmarks.wire import (
    STDLIB_JSON,
    Codec,
    WsConn,
    await_result,
    pipelined_calls,
    pipelined_echo,
)

MESSAGE_BYTES = 200
WINDOW = 64


def run(ctx: BenchContext) -> ScenarioResult:
    res = ScenarioResult()
    n_echo = ctx.size(20_000, 400)
    n_pingpong = ctx.size(5_000, 200)
    n_calls = ctx.size(8_000, 300)
    n_single = ctx.size(3_000, 100)
    repeats = ctx.repeats(5)
    res.params = {
        "message_bytes": MESSAGE_BYTES,
        "window": WINDOW,
        "echo_messages": n_echo,
        "pingpong_messages": n_pingpong,
        "pipelined_calls": n_calls,
        "single_calls": n_single,
        "repeats": repeats,
        "trivial_call": {"tool": "read_file", "args": TRIVIAL_ARGS, "stream": False},
    }
    m_echo = res.measurement("echo_pipelined", "raw echo, pipelined (window 64)", "msgs/s")
    m_pong = res.measurement("echo_pingpong", "raw echo, ping-pong", "msgs/s")
    m_fast = res.measurement(
        "echo_wsproto_pipelined", "wsproto echo, pipelined (window 64)", "msgs/s"
    )
    m_tw = res.measurement("toolwire_pipelined", "toolwire calls, pipelined (window 64)", "calls/s")
    m_twmem = res.measurement(
        "toolwire_memory_pipelined", "toolwire calls, pipelined, memory journal", "calls/s"
    )
    m_twstd = res.measurement(
        "toolwire_pipelined_stdlib_json",
        "toolwire calls, pipelined, standard-library JSON client",
        "calls/s",
    )
    m_twmp = res.measurement(
        "toolwire_pipelined_msgpack", "toolwire calls, pipelined, msgpack", "calls/s"
    )
    m_one = res.measurement("toolwire_single", "toolwire calls, one at a time", "calls/s")
    m_off = res.measurement(
        "toolwire_pipelined_nometrics",
        "toolwire calls, pipelined (window 64), metrics off",
        "calls/s",
    )
    recorded_as = {"toolwire": m_tw, "toolwire-memory": m_twmem, "toolwire-nometrics": m_off}
    payload = "x" * MESSAGE_BYTES

    # The msgpack and standard-library JSON clients call a second agent like `toolwire`: the
    # records of one agent's calls stay for forget_after_s (an hour), and every variant's
    # calls on one agent together would pass serve's max_records (100,000), past which new
    # calls get `over_limit` (docs/operations.md).
    with servers(
        ctx, "echo", "echo-wsproto", "toolwire", "toolwire-2", "toolwire-memory",
        "toolwire-nometrics",
    ) as srv:  # fmt: skip
        echo = srv["echo"]

        def echo_pipelined(r: int, server: str = "echo") -> None:
            frames: list[str | bytes] = [payload] * n_echo
            warm: list[str | bytes] = [payload] * min(n_echo, 500)
            timed_ws(
                srv[server],
                lambda c: pipelined_echo(c, frames, WINDOW),
                warmup=lambda c: pipelined_echo(c, warm, WINDOW),
            ).record(m_echo if server == "echo" else m_fast)

        def echo_pingpong(r: int) -> None:
            async def body(conn: WsConn) -> int:
                for _ in range(n_pingpong):
                    await conn.ws.send_message(payload)
                    await conn.ws.get_message()
                return n_pingpong

            timed_ws(echo, body).record(m_pong)

        def toolwire_pipelined(r: int, encoding: str = "json", server: str = "toolwire") -> None:
            codec = Codec(encoding)
            chat = f"transport-{encoding}-{server}-{r}"
            frames = [
                codec.call(chat, f"c{i}", "read_file", TRIVIAL_ARGS, stream=False)
                for i in range(n_calls)
            ]
            warm = [
                codec.call(chat, f"w{i}", "read_file", TRIVIAL_ARGS, stream=False)
                for i in range(min(n_calls, 500))
            ]
            m = {"json": recorded_as.get(server), STDLIB_JSON: m_twstd}.get(encoding, m_twmp)
            assert m is not None, (encoding, server)
            timed_ws(
                srv[server],
                lambda c: pipelined_calls(c, codec, frames, WINDOW),
                token=srv.token,
                subprotocol=codec.subprotocol,
                warmup=lambda c: pipelined_calls(c, codec, warm, WINDOW),
            ).record(m)

        def toolwire_single(r: int) -> None:
            codec = Codec("json")
            chat = f"transport-single-{r}"
            frames = [
                codec.call(chat, f"c{i}", "read_file", TRIVIAL_ARGS, stream=False)
                for i in range(n_single)
            ]

            async def body(conn: WsConn) -> int:
                for i, frame in enumerate(frames):
                    await conn.ws.send_message(frame)
                    await await_result(conn, codec, f"c{i}")
                return n_single

            timed_ws(srv["toolwire"], body, token=srv.token, subprotocol=codec.subprotocol).record(
                m_one
            )

        variants = [
            echo_pipelined,
            lambda r: echo_pipelined(r, "echo-wsproto"),
            echo_pingpong,
            agent(toolwire_pipelined),
            # Right after its metrics-on twin: the pair meets the same machine load.
            agent(lambda r: toolwire_pipelined(r, server="toolwire-nometrics")),
            agent(lambda r: toolwire_pipelined(r, server="toolwire-memory")),
            agent(lambda r: toolwire_pipelined(r, "msgpack", server="toolwire-2")),
            agent(lambda r: toolwire_pipelined(r, STDLIB_JSON, server="toolwire-2")),
            agent(toolwire_single),
        ]
        run_side_by_side(ctx, "transport", variants, repeats)

    res.comparisons = [
        Comparison(
            "trivial calls over one connection (pipelined, JSON) vs raw echo messages",
            "toolwire_pipelined",
            "echo_pipelined",
            goal=Goal("ratio>=", 0.6, ">= 0.6x echo msgs/s"),
        ),
        Comparison(
            "trivial calls (pipelined), standard-library JSON client, vs raw echo messages",
            "toolwire_pipelined_stdlib_json",
            "echo_pipelined",
            goal=Goal("ratio>=", 0.5, ">= 0.5x echo msgs/s"),
        ),
        Comparison(
            "trivial calls (pipelined, JSON) vs the best Python echo (wsproto, coalesced)",
            "toolwire_pipelined",
            "echo_wsproto_pipelined",
        ),
        Comparison(
            "trivial calls (pipelined, JSON), memory journal, vs raw echo messages",
            "toolwire_memory_pipelined",
            "echo_pipelined",
        ),
        Comparison(
            "trivial calls (pipelined, msgpack) vs raw echo messages",
            "toolwire_pipelined_msgpack",
            "echo_pipelined",
        ),
        Comparison(
            "trivial calls one at a time vs raw echo ping-pong",
            "toolwire_single",
            "echo_pingpong",
        ),
        Comparison(
            "trivial calls (pipelined, JSON), metrics on vs off",
            "toolwire_pipelined",
            "toolwire_pipelined_nometrics",
            goal=Goal("ratio>=", 0.97, ">= 0.97x metrics off"),
        ),
    ]
    return res
