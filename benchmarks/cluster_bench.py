"""The local 3-node cluster against the single broker: how long they take to start and stop, and how long
a writer waits when a broker dies (the cluster: a partition leader SIGKILLed, leadership moves; the single
broker: stopped and started again, the only way back).

    .venv/bin/python -m benchmarks.cluster_bench [--repeats 3] [--markdown]

Every stack runs in a temporary state folder on free ports, beside any other broker. Times are medians
over the repeats, in seconds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient

from benchmarks._table import add_markdown_flag, print_table
from pipeline.tools.stack.local_broker import LocalBroker, free_port_block
from pipeline.tools.stack.local_cluster import LocalCluster
from topics.kafka.admin import TopicSpec, ensure_topics

TOPIC = "bench.writes"


def timed(call: Callable[[], object]) -> float:
    started = time.monotonic()
    call()
    return time.monotonic() - started


class Writer:
    """An idempotent producer (acks=all) writing one record at a time and waiting for each ack."""

    def __init__(self, bootstrap: str) -> None:
        self.producer = Producer(
            # Idempotence means acks=all; connection-refused lines while a broker is down are expected here.
            {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 0, "log_level": 0}
        )
        self.failed: list[str] = []

    def write(self, timeout_s: float = 120.0) -> None:
        def delivered(error: object, _message: object) -> None:
            if error is not None:
                self.failed.append(str(error))

        self.producer.produce(TOPIC, b"x", on_delivery=delivered)
        if self.producer.flush(timeout_s) or self.failed:
            msg = f"a write was not acknowledged within {timeout_s} s: {self.failed}"
            raise RuntimeError(msg)

    def gap(self, fault: Callable[[], None]) -> float:
        """Seconds from the last acknowledged write before ``fault`` to the first acknowledged after it."""
        self.write()
        before = time.monotonic()
        fault()
        self.write()
        return time.monotonic() - before


def leader(bootstrap: str, topic: str) -> int:
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    return metadata.topics[topic].partitions[0].leader


def single_round(folder: Path) -> dict[str, float]:
    broker = LocalBroker(folder / "single", port=free_port_block(2))
    out = {"first up": timed(broker.up)}
    ensure_topics(broker.bootstrap, [TopicSpec(TOPIC, 1)])
    writer = Writer(broker.bootstrap)

    def restart() -> None:
        broker.down()
        broker.up()

    out["writes resume after losing a broker"] = writer.gap(restart)
    out["down"] = timed(broker.down)
    out["up again"] = timed(broker.up)
    broker.down()
    return out


def cluster_round(folder: Path) -> dict[str, float]:
    cluster = LocalCluster(folder / "cluster", brokers=3, port=free_port_block(6))
    try:
        out = {"first up": timed(cluster.up)}
        ensure_topics(cluster.bootstrap, [TopicSpec(TOPIC, 1)])
        writer = Writer(cluster.bootstrap)
        victim = leader(cluster.bootstrap, TOPIC)
        out["writes resume after losing a broker"] = writer.gap(lambda: cluster.stop_node(victim, kill=True))
        out["node back in the cluster"] = timed(lambda: cluster.start_node(victim))
        out["down"] = timed(cluster.down)
        out["up again"] = timed(cluster.up)
    finally:
        cluster.down()
    return out


COLUMNS = ("first up", "up again", "down", "writes resume after losing a broker", "node back in the cluster")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="rounds per stack (default: %(default)s)")
    add_markdown_flag(parser)
    args = parser.parse_args()
    rows = []
    for name, round_ in (("1 broker (baseline)", single_round), ("3-node cluster", cluster_round)):
        rounds = []
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory(prefix="mixflow-cluster-bench-") as tmp:
                try:
                    rounds.append(round_(Path(tmp)))
                except (KafkaException, RuntimeError) as exc:
                    print(f"{name}: a round failed: {exc}", file=sys.stderr)
        medians = [statistics.median(r[c] for r in rounds) if rounds and c in rounds[0] else None for c in COLUMNS]
        rows.append([name, len(rounds), *("-" if m is None else f"{m:.1f}" for m in medians)])
    title = f"seconds, medians of {args.repeats} rounds"
    print_table(["stack", "rounds", *COLUMNS], rows, title=title, markdown=args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
