"""The cost of the secured stack's mTLS listener: a secured broker's start-up with and without it, and a
client's connect time by certificate (SSL, the mTLS listener) against SCRAM (SASL_SSL, the client listener).

    .venv/bin/python -m benchmarks.mtls_bench [--starts 3] [--connects 20] [--markdown]

- **start-up**: ``LocalBroker.up()`` of a fresh secured broker (its storage formatted, the JVM started, until
  it answers the admin's metadata request), ``--starts`` times each way, alternating; *without mTLS* is the
  same broker with the mTLS listener left out of its listeners;
- **connect**: a fresh ``AdminClient`` listing the cluster's topics, ``--connects`` times each way,
  alternating, on one secured broker: the admin by SCRAM, and the admin by a certificate ``CN=admin`` from the
  stack's CA (``mixflow users add admin --cert``).

Medians; ratio = mTLS / the other.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient

from benchmarks._table import add_markdown_flag, print_table
from pipeline.tools.stack.client_certs import issue_client_certificate
from pipeline.tools.stack.local_broker import LocalBroker, free_port_block
from pipeline.tools.stack.secure import MTLS_LISTENER, broker_security, ensure_secrets

_LISTENERS = ("listeners", "advertised.listeners")


def _broker(folder: Path, *, mtls: bool) -> LocalBroker:
    broker = LocalBroker(folder, port=free_port_block(3))
    secrets = ensure_secrets(broker.state_dir, [broker.host], broker.bootstrap)
    broker.security = broker_security(secrets, broker.bootstrap)
    if not mtls:
        overrides = broker.security.overrides
        broker.overrides = {key: overrides[key].split(f",{MTLS_LISTENER}://")[0] for key in _LISTENERS}
        protocols = overrides["listener.security.protocol.map"]
        broker.overrides["listener.security.protocol.map"] = protocols.replace(f",{MTLS_LISTENER}:SSL", "")
    return broker


def start_up(folder: Path, starts: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"without mTLS": [], "with mTLS": []}
    for repeat in range(starts):
        order = [False, True] if repeat % 2 == 0 else [True, False]
        for mtls in order:
            broker = _broker(folder / f"start-{repeat}-{mtls}", mtls=mtls)
            began = time.monotonic()
            broker.up(timeout_s=180)
            times["with mTLS" if mtls else "without mTLS"].append(time.monotonic() - began)
            broker.down()
    return times


def _connect_ms(config: dict[str, Any]) -> float:
    began = time.monotonic()
    AdminClient({**config, "log_level": 0}).list_topics(timeout=30)
    return (time.monotonic() - began) * 1000


def connects(folder: Path, count: int) -> dict[str, list[float]]:
    broker = _broker(folder / "connect", mtls=True)
    broker.up(timeout_s=180)
    try:
        secrets = broker.security.secrets  # type: ignore[union-attr]
        made = issue_client_certificate(broker.state_dir, "admin")
        configs = {
            "SCRAM (SASL_SSL)": dict(secrets.admin_client_config(broker.bootstrap)),
            "certificate (SSL)": {
                "bootstrap.servers": f"{broker.host}:{broker.mtls_port}",
                "security.protocol": "SSL",
                "ssl.ca.location": str(secrets.ca),
                "ssl.certificate.location": str(made.certificate),
                "ssl.key.location": str(made.key),
            },
        }
        for config in configs.values():
            _connect_ms(config)  # warm-up
        times: dict[str, list[float]] = {name: [] for name in configs}
        for repeat in range(count):
            names = list(configs) if repeat % 2 == 0 else list(reversed(configs))
            for name in names:
                times[name].append(_connect_ms(configs[name]))
        return times
    finally:
        broker.down()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=3)
    parser.add_argument("--connects", type=int, default=20)
    add_markdown_flag(parser)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mtls-bench-") as folder:
        started = start_up(Path(folder), args.starts)
        connected = connects(Path(folder), args.connects)
    up = {name: statistics.median(values) for name, values in started.items()}
    connect = {name: statistics.median(values) for name, values in connected.items()}
    rows = [
        ["secured broker: up() of a fresh one", "s", f"{up['without mTLS']:.1f}", f"{up['with mTLS']:.1f}",
         f"{up['with mTLS'] / up['without mTLS']:.2f}"],
        ["client: connect and list metadata", "ms", f"{connect['SCRAM (SASL_SSL)']:.0f}",
         f"{connect['certificate (SSL)']:.0f}", f"{connect['certificate (SSL)'] / connect['SCRAM (SASL_SSL)']:.2f}"],
    ]  # fmt: skip
    print(f"start-ups (s): {started}")
    print(f"connects (ms): {connected}")
    print_table(["", "unit", "without mTLS / SCRAM", "with mTLS / certificate", "ratio"], rows, markdown=args.markdown)


if __name__ == "__main__":
    main()
