"""`/metrics`: the agent's numbers in the Prometheus text format (PROTOCOL.md 9.7).

Nothing is counted here. At scrape time a custom `prometheus_client` collector reads the plain
counters the runtime bumps (`actors/metrics.py`) and the agent's tables (chats, records,
processes, connections), and `prometheus_client` writes the exposition: this module never
formats a metric line itself. A scrape walks every record once (about 30 ms for 100,000 records
in 10,000 chats on a shared 2-core machine); the hot path pays nothing for it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.process_collector import ProcessCollector

from toolwire.actors.metrics import COMMIT_BUCKETS_S, Durations
from toolwire.actors.records import RecordState

if TYPE_CHECKING:
    from toolwire.actors.agent import Agent

# The classic text format (0.0.4): what every Prometheus server and agent scrapes.
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4

READY_HELP = "1 once journal recovery is done and requests are taken, else 0"
BUSIEST_HELP = "Running processes of the busiest chat (see toolwire_processes_per_chat_limit)"
LIMIT_HELP = "The max_processes_per_chat limit: execute calls past it get over_limit"
OUTPUT_HELP = "Bytes the commands of execute calls wrote (stdout and stderr), as they arrive"
RECORDS_LIMIT_HELP = "The max_records limit: calls that would hold more records get over_limit"
PROCESSES_LIMIT_HELP = "The max_processes limit (all chats): execute calls past it get over_limit"
IN_FLIGHT_HELP = "Bytes of messages being received in pieces, over all connections"
IN_FLIGHT_LIMIT_HELP = (
    "The max_message_bytes_in_flight limit: readers wait before reading more past it"
)


class AgentCollector:
    """The toolwire_* metric families, computed from the agent when collected."""

    def __init__(
        self,
        agent: Agent,
        connections: Callable[[], int],
        message_bytes_in_flight: Callable[[], int] = lambda: 0,
    ) -> None:
        self._agent = agent
        self._connections = connections
        self._message_bytes_in_flight = message_bytes_in_flight

    def collect(self) -> Iterator[Metric]:
        agent = self._agent
        limits = agent.ctx.limits
        running = parked = records = processes = busiest = 0
        for chat in list(agent.chats.values()):
            records += len(chat.records)
            for record in chat.records:
                if record.state is RecordState.RUNNING:
                    running += 1
                elif record.state is RecordState.AWAITING_APPROVAL:
                    parked += 1
            in_chat = chat.processes.running_count()
            processes += in_chat
            busiest = max(busiest, in_chat)
        gauges = [
            ("toolwire_ready", READY_HELP, int(agent.ready)),
            ("toolwire_calls_running", "Calls started and not ended yet", running),
            ("toolwire_gates_parked", "Calls parked at an approval gate", parked),
            ("toolwire_processes_running", "Running processes of all chats", processes),
            ("toolwire_chat_processes_running_max", BUSIEST_HELP, busiest),
            (
                "toolwire_processes_per_chat_limit",
                LIMIT_HELP,
                agent.ctx.limits.max_processes_per_chat,
            ),
            ("toolwire_connections", "Open WebSocket connections", self._connections()),
            ("toolwire_chats", "Chats held (with records, processes or work)", len(agent.chats)),
            ("toolwire_records", "Tool call records held until forgotten", records),
            ("toolwire_records_limit", RECORDS_LIMIT_HELP, limits.max_records),
            ("toolwire_processes_limit", PROCESSES_LIMIT_HELP, limits.max_processes),
            (
                "toolwire_message_bytes_in_flight",
                IN_FLIGHT_HELP,
                self._message_bytes_in_flight(),
            ),
            (
                "toolwire_message_bytes_in_flight_limit",
                IN_FLIGHT_LIMIT_HELP,
                limits.max_message_bytes_in_flight,
            ),
        ]
        for name, help_text, value in gauges:
            yield GaugeMetricFamily(name, help_text, value=value)

        counters = agent.ctx.metrics
        calls = CounterMetricFamily(
            "toolwire_calls", "Calls that ended, by tool and outcome", labels=["tool", "outcome"]
        )
        errors = CounterMetricFamily(
            "toolwire_errors", "error messages sent to clients, by code", labels=["code"]
        )
        output = CounterMetricFamily("toolwire_output_bytes", OUTPUT_HELP)
        if counters is not None:
            for tool, outcomes in list(counters.calls.items()):
                for outcome, n in list(outcomes.items()):
                    calls.add_metric([tool, str(outcome)], n)
            for code, n in list(counters.errors.items()):
                errors.add_metric([code], n)
            output.add_metric([], counters.output_bytes)
        yield calls
        yield errors
        yield output
        yield _histogram(
            "toolwire_journal_commit_seconds",
            "Time of one journal group commit (one transaction and fsync)",
            agent.ctx.journal.commit_durations,
        )


def _histogram(name: str, help_text: str, durations: Durations | None) -> HistogramMetricFamily:
    # A journal that never commits (memory) still shows the histogram, empty: dashboards and
    # alerts written for the SQLite journal then read zero instead of "no data".
    source = durations if durations is not None else Durations(COMMIT_BUCKETS_S)
    buckets = [(_bound(bound), n) for bound, n in source.cumulative()]
    return HistogramMetricFamily(name, help_text, buckets=buckets, sum_value=source.sum)


def _bound(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(bound)


class MetricsPage:
    """The registry behind `/metrics`: the agent's families plus the process's own (CPU,
    memory, open files: `prometheus_client`'s process collector). Built on the first scrape."""

    def __init__(
        self,
        agent: Agent,
        connections: Callable[[], int],
        message_bytes_in_flight: Callable[[], int] = lambda: 0,
    ) -> None:
        self._agent = agent
        self._connections = connections
        self._message_bytes_in_flight = message_bytes_in_flight
        self._registry: CollectorRegistry | None = None

    def render(self) -> bytes:
        registry = self._registry
        if registry is None:
            registry = self._registry = CollectorRegistry(auto_describe=False)
            registry.register(
                AgentCollector(self._agent, self._connections, self._message_bytes_in_flight)
            )
            ProcessCollector(registry=registry)
        return generate_latest(registry)
