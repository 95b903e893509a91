"""The chaos suite's object store faults: their schedule (pure), and a whole job run under restarts and stalls of
a real local object store (Versity S3 Gateway), audited at the end as every chaos run is."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.tools.chaos import ChaosOptions, FaultKind, Targets, plan_faults, run_chaos
from pipeline.tools.chaos.object_store import ChaosObjectStore
from pipeline.tools.chaos.schedule import ACCESS_KINDS, OBJECT_STORE_KINDS
from pipeline.tools.stack.object_store import LocalObjectStore, ObjectStoreStopped
from tests.loader_support import build_example_data, write_spec
from tests.object_store import running_object_store

WITH_STORE = Targets(loaders=("load-a-0",), sinks=("sink-0", "sink-1"), shadows=1, broker=True, object_store=True)


@given(
    seed=st.integers(0, 2**32),
    count=st.integers(0, 30),
    max_down_s=st.floats(0, 10),
    max_stall_s=st.floats(1, 10),
)
def test_object_store_faults_are_drawn_only_with_a_store_and_last_within_their_bounds(
    seed: int, count: int, max_down_s: float, max_stall_s: float
) -> None:
    faults = plan_faults(seed, count, WITH_STORE, max_down_s=max_down_s, max_stall_s=max_stall_s)
    if count >= len(FaultKind) - len(ACCESS_KINDS):  # no principals, no s3:// sources: nothing to revoke
        assert {f.kind for f in faults} == set(FaultKind) - ACCESS_KINDS
    for fault in faults:
        if fault.kind is FaultKind.RESTART_OBJECT_STORE:
            assert 0 <= fault.down_s <= max_down_s + 1e-3 and "down" in fault.describe()
        elif fault.kind in OBJECT_STORE_KINDS:  # stalled, slow or refusing a while
            assert 1 - 1e-3 <= fault.down_s <= max_stall_s + 1e-3 and f"for {fault.down_s:.1f} s" in fault.describe()
        if fault.kind in OBJECT_STORE_KINDS:
            assert fault.target is None
    without = Targets(WITH_STORE.loaders, WITH_STORE.sinks, WITH_STORE.shadows, WITH_STORE.broker)
    assert not {f.kind for f in plan_faults(seed, count, without)} & OBJECT_STORE_KINDS


def test_a_run_with_object_store_faults_refuses_a_folder_where_none_runs(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "chaos", "127.0.0.1:9", tmp_path / "data")
    options = ChaosOptions(spec=spec, faults=1, seed=1, out=tmp_path / "chaos", object_store=tmp_path / "nothing")
    with pytest.raises(ObjectStoreStopped, match="no local object store runs from"):
        run_chaos(options)
    assert not (tmp_path / "chaos").exists()


def test_the_run_specs_name_the_proxy_where_the_spec_names_the_store(tmp_path: Path) -> None:
    chaos = ChaosObjectStore(LocalObjectStore(tmp_path, port=7123)).open()
    try:
        body = {
            "storage": {"endpoint_url": "http://127.0.0.1:7123/", "region": "us-east-1"},
            "sources": [{"path": "s3://b/p", "storage": {"endpoint_url": "http://127.0.0.1:7123"}}, {"path": "x"}],
            "kafka": {"bootstrap_servers": "127.0.0.1:7123"},
        }
        proxied = chaos.through_proxy(body)
        assert proxied["storage"] == {"endpoint_url": chaos.proxy.endpoint, "region": "us-east-1"}
        assert proxied["sources"][0]["storage"]["endpoint_url"] == chaos.proxy.endpoint
        assert proxied["sources"][1] == {"path": "x"} and proxied["kafka"] == body["kafka"]
        assert chaos.environment()["AWS_ENDPOINT_URL"] == chaos.proxy.endpoint
        before = dict(os.environ)
        with chaos.environ():
            assert os.environ["AWS_ENDPOINT_URL"] == chaos.proxy.endpoint
            assert os.environ["AWS_SECRET_ACCESS_KEY"] == chaos.store.credentials().secret_key
        assert dict(os.environ) == before
    finally:
        chaos.close()


@pytest.mark.object_store
def test_a_job_survives_object_store_restarts_and_stalls(tmp_path: Path, kafka_bootstrap: str) -> None:
    # The sources here are local files: what this checks is that the run strikes the store (restarted, stalled,
    # slow, refusing) and the job goes on and passes its audit. A spec whose sources are s3:// paths in this
    # store runs the same way, its roles reaching the store through the run's fault proxy.
    data = build_example_data(tmp_path / "data", limit=8)
    spec = write_spec(tmp_path, "chaos", kafka_bootstrap, data)
    with running_object_store(tmp_path / "store") as store:
        pid = store.store.running_pid()
        options = ChaosOptions(
            spec=spec,
            faults=4,
            seed=5,
            out=tmp_path / "chaos",
            shadows=0,
            bootstrap=kafka_bootstrap,
            kinds=tuple(OBJECT_STORE_KINDS),
            object_store=store.store.state_dir,
            max_down_s=1.0,
            max_stall_s=2.0,
            max_pause_s=0.5,  # waiting only: each fault still waits until the one before is survived
            max_lead_steps=2,
        )
        report = run_chaos(options)
        print("\n".join(report.lines()))
        assert report.ok, "\n".join(report.lines())
        survived = {kind for kind, (injected, survived) in report.by_kind().items() if injected == survived}
        assert survived == set(OBJECT_STORE_KINDS)
        assert store.store.status().answering and store.store.running_pid() != pid, "the store was not restarted"
        assert any(line.startswith("stall-object-store: away") for line in report.lines())


@pytest.mark.object_store
def test_a_job_reading_its_sources_from_the_object_store_survives_its_faults(
    tmp_path: Path, kafka_bootstrap: str
) -> None:
    """End to end: the example's three sources in a bucket (and nowhere on disk), the loaders reading them
    through the run's fault proxy with a key of the run's own while the store is restarted, stalled, slowed and
    refuses, the key is revoked twice (the loaders stop with exit 5 and the store's refusal, no dead letter, and
    run again once it is back), and loaders are killed; the audit reads the sources from the store as well.
    Needs the s3:// sources (connectors.storage)."""
    pytest.importorskip("connectors.storage", reason="s3:// sources are not in this checkout")
    import shutil

    import yaml

    from pipeline.cli import main

    data = build_example_data(tmp_path / "data", limit=8)
    with running_object_store(tmp_path / "store") as store:
        local = ("--object-store-dir", str(store.store.state_dir))
        assert main(["objects", "put", str(data), "s3://chaos-data/example", "--create-bucket", *local]) == 0
        spec = write_spec(tmp_path, "chaos", kafka_bootstrap, data)
        body = yaml.safe_load(spec.read_text())
        for source in body["sources"]:
            source["path"] = f"s3://chaos-data/example/{Path(source['path']).name}"
        body["storage"] = {"endpoint_url": store.endpoint_url, "region": store.region, "addressing_style": "path"}
        body["tokenizer"] = str(shutil.copy(data / "tokenizer.json", tmp_path / "tokenizer.json"))
        spec.write_text(yaml.safe_dump(body, sort_keys=False))
        shutil.rmtree(data)  # the loaders can read the sources from the store only

        options = ChaosOptions(
            spec=spec,
            faults=7,
            seed=2,  # a fault of every kind, the key revoked twice
            out=tmp_path / "chaos",
            shadows=0,
            bootstrap=kafka_bootstrap,
            kinds=(*OBJECT_STORE_KINDS, FaultKind.KILL_LOADER, FaultKind.REVOKE_STORAGE_KEY),
            object_store=store.store.state_dir,
            # Short pauses and outages (waiting only): the seed draws the same kinds and targets whatever these
            # bounds, each fault waits until the one before is survived, and a stall still lasts at least 1 s.
            max_down_s=1.0,
            max_stall_s=2.0,
            max_revoke_s=3.0,
            max_pause_s=0.5,
            max_lead_steps=2,
        )
        report = run_chaos(options)
        print("\n".join(report.lines()))
        assert report.ok, "\n".join(report.lines())
        assert report.audit is not None and report.audit.samples == report.audit.expected > 0
        assert report.audit.dead_letters == 0 and report.failures == []
        run_spec = yaml.safe_load((tmp_path / "chaos" / "spec.yaml").read_text())
        assert run_spec["storage"]["endpoint_url"] not in (store.endpoint_url, None), "the roles bypassed the proxy"

        # The loaders read with the run's own key, which stopped them when revoked and is gone after the run.
        revoked = [f for f in report.injected if f.fault.kind is FaultKind.REVOKE_STORAGE_KEY]
        assert len(revoked) == 2 and all(f.refused and f.survived_s is not None for f in revoked)
        assert report.refusals and all(r.role.startswith("load-") for r in report.refusals)
        for refusal in report.refusals:
            assert refusal.line.startswith("mixflow load: error: s3://chaos-data/example/"), refusal
            assert "access denied" in refusal.line or "refuses these credentials" in refusal.line, refusal
        [key] = {r.what.rpartition(" ")[2] for r in report.refusals}
        assert key != store.store.credentials().access_key
        assert key not in (store.store.iam_dir / "users.json").read_text(), "the run's user stays in the store"
