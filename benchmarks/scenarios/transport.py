"""Scenario `transport`: toolwire's trivial calls against the raw WebSocket echo limit.

Both servers run in their own processes; this process is the client. The echo server returns
200-byte messages over one connection, one at a time (ping-pong) and pipelined with a window of
64 in flight; toolwire answers trivial calls (`read_file` of a 300-byte file, `stream: false`)
over one connection, pipelined with the same window of 64 and one at a time. A toolwire call is
at least three messages (`call`, `accepted`, `result`), an echo is two. The pipelined JSON calls
also run against a second agent with its operator's counters off (`--no-metrics`): what
counting for `/metrics` costs the hot path.
"""

from __future__ import annotations

from toolwire.benchmarks.core import (
    BenchContext,
    Comparison,
    Goal,
    ScenarioResult,
    run_side_by_side,
)
from toolwire.benchmarks.scenarios.common import TRIVIAL_ARGS, servers, timed_ws
from toolwire.benchmarks.wire import Codec, WsConn, await_result, pipelined_calls, pipelined_echo

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
    m_tw = res.measurement("toolwire_pipelined", "toolwire calls, pipelined (window 64)", "calls/s")
    m_twmp = res.measurement(
        "toolwire_pipelined_msgpack", "toolwire calls, pipelined, msgpack", "calls/s"
    )
    m_one = res.measurement("toolwire_single", "toolwire calls, one at a time", "calls/s")
    m_off = res.measurement(
        "toolwire_pipelined_nometrics",
        "toolwire calls, pipelined (window 64), metrics off",
        "calls/s",
    )
    payload = "x" * MESSAGE_BYTES

    with servers(ctx, "echo", "toolwire", "toolwire-nometrics") as srv:
        echo, tw = srv["echo"], srv["toolwire"]

        def echo_pipelined(r: int) -> None:
            frames: list[str | bytes] = [payload] * n_echo
            warm: list[str | bytes] = [payload] * min(n_echo, 500)
            timed_ws(
                echo,
                lambda c: pipelined_echo(c, frames, WINDOW),
                warmup=lambda c: pipelined_echo(c, warm, WINDOW),
            ).record(m_echo)

        def echo_pingpong(r: int) -> None:
            async def body(conn: WsConn) -> int:
                for _ in range(n_pingpong):
                    await conn.ws.send_message(payload)
                    await conn.ws.get_message()
                return n_pingpong

            timed_ws(echo, body).record(m_pong)

        def toolwire_pipelined(r: int, encoding: str = "json", metrics: bool = True) -> None:
            codec = Codec(encoding)
            chat = f"transport-{encoding}-{r}"
            frames = [
                codec.call(chat, f"c{i}", "read_file", TRIVIAL_ARGS, stream=False)
                for i in range(n_calls)
            ]
            warm = [
                codec.call(chat, f"w{i}", "read_file", TRIVIAL_ARGS, stream=False)
                for i in range(min(n_calls, 500))
            ]
            measurement = m_tw if encoding == "json" else m_twmp
            timed_ws(
                tw if metrics else srv["toolwire-nometrics"],
                lambda c: pipelined_calls(c, codec, frames, WINDOW),
                token=srv.token,
                subprotocol=codec.subprotocol,
                warmup=lambda c: pipelined_calls(c, codec, warm, WINDOW),
            ).record(measurement if metrics else m_off)

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

            timed_ws(tw, body, token=srv.token, subprotocol=codec.subprotocol).record(m_one)

        variants = [
            echo_pipelined,
            echo_pingpong,
            toolwire_pipelined,
            # Right after its metrics-on twin: the pair meets the same machine load.
            lambda r: toolwire_pipelined(r, metrics=False),
            lambda r: toolwire_pipelined(r, "msgpack"),
            toolwire_single,
        ]
        run_side_by_side(ctx, "transport", variants, repeats)

    res.comparisons = [
        Comparison(
            "trivial calls over one connection (pipelined, JSON) vs raw echo messages",
            "toolwire_pipelined",
            "echo_pipelined",
            goal=Goal("ratio>=", 0.5, ">= 0.5x echo msgs/s"),
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
