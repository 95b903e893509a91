"""Topic administration at 10k ranks: a job's rank topics created, checked and deleted in batches, against one
topic with a partition per rank (the layout the per-topic one was weighed against).

    .venv/bin/python -m benchmarks.topic_admin_bench [--ranks 10240] [--batch 500] [--bootstrap-servers H:P]

Rows, run one after another on the same broker, each under a job name of its own whose topics are deleted at
the end, even on failure:

- **per-topic, batch B**: ``ensure_job_topics`` creates the job's topics (one source) ``B`` a request; then a
  second ``ensure_job_topics`` finds them all and checks their layout (list, describe configs in batches);
  then ``delete_job_topics``.
- **one topic, R partitions** (the baseline): one ``create_topics`` of ``<job>.ranks`` with R partitions and
  the rank topics' configs, its layout checked the same way, then deleted. A KRaft controller refuses a
  request of more than 10,000 partitions (``POLICY_VIOLATION``), so the row says so where R is larger, and a
  second row has the most one request may create, 10,000.

``delete s`` runs until the deleted topics have left the broker's metadata (the delete requests themselves
return as soon as the controller has recorded them; the broker drops the logs later).

``metadata ms`` is what a sink pays on start: one metadata request for the one topic it reads (its rank topic,
or the R-partition topic, whose every partition comes back). A single run per row: each creates R partition
logs on the shared broker, and repeating it would load the broker others use.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid

from confluent_kafka.admin import AdminClient

from benchmarks._table import add_markdown_flag, print_table
from topics.errors import MixflowError
from topics.formats.names import JobTopics
from topics.kafka.admin import (
    DEFAULT_BATCH_TOPICS,
    TopicSpec,
    delete_job_topics,
    ensure_job_topics,
    ensure_topics,
    job_layout,
)

TIMEOUT_S = 300.0
MAX_PARTITIONS_PER_REQUEST = 10_000  # KRaft's limit on one CreateTopics request


def _metadata_ms(bootstrap: str, topic: str) -> tuple[float, int]:
    """Median time of 5 metadata requests for ``topic`` alone, and its partition count."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.list_topics(topic=topic, timeout=30)  # the connection first
    times, partitions = [], 0
    for _ in range(5):
        start = time.perf_counter()
        metadata = admin.list_topics(topic=topic, timeout=30)
        times.append(time.perf_counter() - start)
        partitions = len(metadata.topics[topic].partitions)
    return sorted(times)[2] * 1e3, partitions


def _wait_gone(bootstrap: str, prefix: str) -> None:
    """Until no topic starting with ``prefix`` shows in the metadata, at most ``TIMEOUT_S``."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + TIMEOUT_S
    while any(name.startswith(prefix) for name in admin.list_topics(timeout=30).topics):
        if time.monotonic() > deadline:
            msg = f"topics {prefix}* still in the metadata {TIMEOUT_S:g} s after their deletion"
            raise TimeoutError(msg)
        time.sleep(0.5)


def per_topic(bootstrap: str, ranks: int, batch: int) -> dict[str, object]:
    job = f"bench-admin-{uuid.uuid4().hex[:8]}"
    try:
        start = time.perf_counter()
        created = ensure_job_topics(bootstrap, job, ["web"], ranks, timeout_s=TIMEOUT_S, batch_topics=batch)
        create_s = time.perf_counter() - start
        start = time.perf_counter()
        again = ensure_job_topics(bootstrap, job, ["web"], ranks, timeout_s=TIMEOUT_S, batch_topics=batch)
        check_s = time.perf_counter() - start
        assert again == [], again
        metadata_ms, partitions = _metadata_ms(bootstrap, JobTopics(job).rank(ranks - 1))
    finally:
        start = time.perf_counter()
        deleted = delete_job_topics(bootstrap, job, timeout_s=TIMEOUT_S, batch_topics=batch)
        _wait_gone(bootstrap, f"{job}.")
        delete_s = time.perf_counter() - start
    return {
        "layout": f"per-topic, batch {batch}",
        "topics": len(created),
        "partitions": len(created) - 1 + 8,  # 8 work partitions
        "create s": f"{create_s:.1f}",
        "check s": f"{check_s:.2f}",
        "delete s": f"{delete_s:.2f} ({len(deleted)})",
        "metadata ms": f"{metadata_ms:.2f} ({partitions} partition)",
    }


def one_topic(bootstrap: str, ranks: int) -> dict[str, object]:
    job = f"bench-admin-{uuid.uuid4().hex[:8]}"
    name = f"{job}.ranks"
    rank_config = next(spec.config for spec in job_layout(job, [], 1) if spec.name == JobTopics(job).rank(0))
    spec = TopicSpec(name, ranks, dict(rank_config))
    admin = AdminClient({"bootstrap.servers": bootstrap})
    row: dict[str, object] = {"layout": f"one topic, {ranks} partitions", "topics": 1, "partitions": ranks}
    try:
        start = time.perf_counter()
        ensure_topics(bootstrap, [spec], timeout_s=TIMEOUT_S)
        create_s = time.perf_counter() - start
    except MixflowError as exc:
        return {**row, "create s": f"refused: {exc}", "check s": "", "delete s": "", "metadata ms": ""}
    try:
        start = time.perf_counter()
        assert ensure_topics(bootstrap, [spec], timeout_s=TIMEOUT_S) == []
        check_s = time.perf_counter() - start
        metadata_ms, partitions = _metadata_ms(bootstrap, name)
    finally:
        start = time.perf_counter()
        for future in admin.delete_topics([name], operation_timeout=TIMEOUT_S).values():
            future.result(timeout=TIMEOUT_S)
        _wait_gone(bootstrap, name)
        delete_s = time.perf_counter() - start
    return {
        **row,
        "create s": f"{create_s:.1f}",
        "check s": f"{check_s:.2f}",
        "delete s": f"{delete_s:.2f} (1)",
        "metadata ms": f"{metadata_ms:.2f} ({partitions} partitions)",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=10240)
    parser.add_argument("--batch", type=int, action="append", help=f"topics a request (default {DEFAULT_BATCH_TOPICS})")
    parser.add_argument("--no-baseline", action="store_true", help="skip the one-topic row")
    parser.add_argument("--bootstrap-servers", default="127.0.0.1:9092")
    add_markdown_flag(parser)
    args = parser.parse_args()
    runs = [
        lambda batch=batch: per_topic(args.bootstrap_servers, args.ranks, batch)
        for batch in args.batch or [DEFAULT_BATCH_TOPICS]
    ]
    if not args.no_baseline:
        runs.append(lambda: one_topic(args.bootstrap_servers, args.ranks))
        if args.ranks > MAX_PARTITIONS_PER_REQUEST:
            runs.append(lambda: one_topic(args.bootstrap_servers, MAX_PARTITIONS_PER_REQUEST))
    rows = []
    for run in runs:
        rows.append(run())
        print(rows[-1], file=sys.stderr, flush=True)  # a row is minutes of broker work: keep it if a later one fails
    print_table(list(rows[0]), [list(row.values()) for row in rows], markdown=args.markdown)


if __name__ == "__main__":
    main()
