"""The JSON records on the work, control, state and dead-letter topics: work units, work plans, the mixer
and constructor state, dead letters.

Their bytes are in the topics of running jobs, so they are pinned twice: against reference encoders written
out by hand here, without pydantic (on generated records), and against a fixed corpus of bytes those
encoders wrote. Decoding gives the record back, and bad input a ``DecodeError``
that names the field, never another exception."""

from __future__ import annotations

import base64
import json
import math
import subprocess
import sys
from dataclasses import asdict
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from connectors.work_units import UNIT_KINDS, WorkUnit
from pipeline.kafka.work_plan import WorkPlan
from pipeline.planning.mixing import MixtureChange
from pipeline.planning.mixing.state import MixerState
from pipeline.planning.step.state import ConstructorState, SampleRef, SourcePosition
from topics.errors import DecodeError
from topics.formats.dead_letter import DeadLetter, decode_dead_letter, encode_dead_letter

# -- the encoders as they were: the reference for the bytes ------------------------------------------------


def reference_work_unit(unit: WorkUnit) -> bytes:
    body = asdict(unit)
    # an object's version, and a compressed file's skip: left out while empty
    for pinned, empty in (("etag", ""), ("object_size", 0), ("skip_bytes", 0)):
        if body[pinned] == empty:
            del body[pinned]
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def reference_work_plan(plan: WorkPlan) -> bytes:
    ends = {str(p): e for p, e in sorted(plan.ends.items())}
    return json.dumps({"kind": "work-plan", "source": plan.source, "units": plan.units, "ends": ends}).encode()


def reference_mixer_state(state: MixerState) -> bytes:
    body = {"v": 1, "step": state.step, "credit": state.credit, "long": state.long_credit}
    return json.dumps(body, separators=(",", ":"), allow_nan=False).encode()


def reference_offsets(used: tuple[int, ...]) -> list:
    """Three or more consecutive offsets as a run [first, end), others one by one."""
    out: list = []
    for offset in used:
        if out and isinstance(out[-1], list) and out[-1][1] == offset:
            out[-1][1] += 1
        elif len(out) >= 2 and out[-2:] == [offset - 2, offset - 1] and not isinstance(out[-1], list):
            out[-2:] = [[offset - 2, offset + 1]]
        else:
            out.append(offset)
    return out


def reference_constructor_state(state: ConstructorState) -> bytes:
    body = {
        "v": 1,
        "mixer": json.loads(reference_mixer_state(state.mixer)),
        "sources": {s: [p.low, reference_offsets(p.used)] for s, p in state.positions.items()},
        "deferred": [[r.source, r.offset] for r in state.deferred],
        "exhausted": list(state.exhausted),
        "finished": state.finished,
    }
    # Written only when set, so that states without mixture changes keep the bytes of version 1's start.
    if state.control_offset:
        body["control"] = state.control_offset
    if state.changes:
        body["changes"] = [{"id": c.id, "from_step": c.from_step, "shares": dict(c.shares)} for c in state.changes]
    if state.refused:
        body["refused"] = list(state.refused)
    return json.dumps(body, separators=(",", ":"), allow_nan=False).encode()


def reference_dead_letter(letter: DeadLetter) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    document = {
        "version": 1,
        "source": letter.source,
        "location": letter.location,
        "reason": letter.reason,
        "error_type": letter.error_type,
        "payload": None if letter.payload is None else base64.b64encode(bytes(letter.payload)).decode(),
    }
    value = json.dumps(document, ensure_ascii=True, separators=(",", ":")).encode("ascii")
    source = letter.source.encode("utf-8", "surrogatepass")
    return source, value, [("mixflow.dlq.version", b"1"), ("mixflow.source", source)]


# -- generated records ------------------------------------------------------------------------------------

# Any text: file and source names read from a file system may hold lone surrogates, and the encoders
# write them as \udcxx escapes (pydantic's own JSON parser refuses those, so the decoders parse with json).
texts = st.text(max_size=20)
naturals = st.integers(min_value=0) | st.sampled_from([2**31, 2**53 + 1, 2**63 - 1, 2**64, 10**30])
finite = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from([-0.0, 5e-324, 1e16, 1e-7, 1 / 3])


@st.composite
def work_units(draw: st.DrawFn) -> WorkUnit:
    kind = draw(st.sampled_from(UNIT_KINDS))
    start = draw(naturals)
    return WorkUnit(
        draw(texts),
        draw(texts),
        kind,
        start,
        start + draw(naturals),
        draw(naturals),
        draw(naturals),
        draw(naturals) if kind == "row_group" else None,
        draw(naturals),
        draw(st.sampled_from(["", '"0123abcd"', '"9f-2"'])),
        draw(naturals),
        draw(st.sampled_from([0, 1, 65_535]) | naturals),
    )


work_plans = st.builds(WorkPlan, texts, st.integers(), st.dictionaries(naturals, st.integers(), max_size=8))
mixer_states = st.builds(MixerState, naturals, st.dictionaries(texts, finite, max_size=6), finite)


@st.composite
def constructor_states(draw: st.DrawFn) -> ConstructorState:
    mixer = draw(mixer_states)
    sources = draw(st.lists(texts, max_size=5, unique=True)) + list(mixer.credit)
    positions = {}
    for source in sources:
        low = draw(naturals)
        used = draw(st.lists(st.integers(1, 10**6), max_size=6, unique=True))
        positions[source] = SourcePosition(low, tuple(sorted(low + u for u in used)))
    deferred, exhausted = (), ()
    if sources:
        deferred = tuple(draw(st.lists(st.builds(SampleRef, st.sampled_from(sources), naturals), max_size=6)))
        exhausted = tuple(sorted(draw(st.sets(st.sampled_from(sources)))))
    changes = draw(st.lists(mixture_changes, max_size=3))
    refused = tuple(draw(st.lists(texts, max_size=3)))
    return ConstructorState(
        mixer, positions, deferred, exhausted, draw(st.booleans()), tuple(changes), draw(naturals), refused
    )


mixture_changes = st.builds(
    MixtureChange,
    texts,
    st.integers(0, 10**9),
    st.dictionaries(texts, st.floats(0.0, 1e6), min_size=1, max_size=4).filter(lambda d: sum(d.values()) > 0),
)


dead_letters = st.builds(
    DeadLetter, texts, texts, texts, st.none() | st.binary(max_size=64), st.none() | st.text(max_size=30)
)


@settings(deadline=None, max_examples=300)
@given(unit=work_units())
def test_work_unit_bytes_and_round_trip(unit: WorkUnit) -> None:
    data = unit.to_json()
    assert data == reference_work_unit(unit)
    assert WorkUnit.from_json(data) == unit


@settings(deadline=None, max_examples=300)
@given(plan=work_plans)
def test_work_plan_bytes_and_round_trip(plan: WorkPlan) -> None:
    data = plan.to_json()
    assert data == reference_work_plan(plan)
    decoded = WorkPlan.from_json(data)
    assert decoded == plan and list(decoded.ends) == sorted(plan.ends)


@settings(deadline=None, max_examples=300)
@given(state=mixer_states)
def test_mixer_state_bytes_and_round_trip(state: MixerState) -> None:
    data = state.to_bytes()
    assert data == reference_mixer_state(state)
    decoded = MixerState.from_bytes(data)
    assert decoded == state and decoded.to_bytes() == data  # -0.0 == 0.0: the bytes tell them apart


@settings(deadline=None, max_examples=200)
@given(state=constructor_states())
def test_constructor_state_bytes_and_round_trip(state: ConstructorState) -> None:
    data = state.to_bytes()
    assert data == reference_constructor_state(state)
    decoded = ConstructorState.from_bytes(data)
    assert decoded == state and decoded.to_bytes() == data


@settings(deadline=None, max_examples=300)
@given(letter=dead_letters)
def test_dead_letter_bytes_and_round_trip(letter: DeadLetter) -> None:
    encoded = encode_dead_letter(letter)
    assert encoded == reference_dead_letter(letter)
    assert decode_dead_letter(encoded[1], encoded[2]) == letter


# -- bytes as the encoders above write them, fixed here: what records already on a topic hold ---------------

MIXER = MixerState(12, {"a": 1 / 3, "b": -1e-17, "c": 123456.789, "d": 1e16, "e": 5e-324, "f": -0.0}, -0.1)
MIXER_BYTES = (
    b'{"v":1,"step":12,"credit":{"a":0.3333333333333333,"b":-1e-17,"c":123456.789,"d":1e+16,"e":5e-324,'
    b'"f":-0.0},"long":-0.1}'
)
CORPUS: list[tuple[Any, Any]] = [
    (
        WorkUnit("code", "a/b.parquet", "row_group", 64, 128, epoch=2, estimated_bytes=999, row_group=1),
        b'{"byte_offset":0,"epoch":2,"estimated_bytes":999,"kind":"row_group","path":"a/b.parquet","row_group":1,'
        b'"source":"code","start":64,"stop":128}',
    ),
    (
        WorkUnit(
            "t\u00e9xt", "d\u00e9j\u00e0/\udcff\U0001f600.jsonl", "rows", 10, 2**64, 3, 2**53 + 1, byte_offset=12345
        ),
        b'{"byte_offset":12345,"epoch":3,"estimated_bytes":9007199254740993,"kind":"rows",'
        b'"path":"d\\u00e9j\\u00e0/\\udcff\\ud83d\\ude00.jsonl","row_group":null,"source":"t\\u00e9xt","start":10,'
        b'"stop":18446744073709551616}',
    ),
    (
        WorkPlan("code", 5, {3: 1, 0: 2, 10: 2**40}),
        b'{"kind": "work-plan", "source": "code", "units": 5, "ends": {"0": 2, "3": 1, "10": 1099511627776}}',
    ),
    (WorkPlan("s", 0, {}), b'{"kind": "work-plan", "source": "s", "units": 0, "ends": {}}'),
    (MIXER, MIXER_BYTES),
    (
        ConstructorState.initial(MixerState.initial(["code", "docs"])),
        b'{"v":1,"mixer":{"v":1,"step":0,"credit":{"code":0.0,"docs":0.0},"long":0.0},'
        b'"sources":{"code":[0,[]],"docs":[0,[]]},"deferred":[],"exhausted":[],"finished":false}',
    ),
    (
        ConstructorState(
            MIXER,
            {"a": SourcePosition(7, (9, 12)), "b": SourcePosition()},
            (SampleRef("a", 8), SampleRef("b", 0)),
            ("b",),
            True,
        ),
        b'{"v":1,"mixer":' + MIXER_BYTES + b',"sources":{"a":[7,[9,12]],"b":[0,[]]},"deferred":[["a",8],["b",0]],'
        b'"exhausted":["b"],"finished":true}',
    ),
    (
        DeadLetter("web", "a.jsonl:row=3", "no text", b"\x00raw\xff", "builtins.ValueError"),
        (
            b"web",
            b'{"version":1,"source":"web","location":"a.jsonl:row=3","reason":"no text",'
            b'"error_type":"builtins.ValueError","payload":"AHJhd/8="}',
            [("mixflow.dlq.version", b"1"), ("mixflow.source", b"web")],
        ),
    ),
    (
        DeadLetter("s\udcffrc", "caf\u00e9/\u540d.txt", 'line "1"\n\t\\'),
        (
            b"s\xed\xb3\xbfrc",
            b'{"version":1,"source":"s\\udcffrc","location":"caf\\u00e9/\\u540d.txt","reason":"line \\"1\\"\\n\\t\\\\",'
            b'"error_type":null,"payload":null}',
            [("mixflow.dlq.version", b"1"), ("mixflow.source", b"s\xed\xb3\xbfrc")],
        ),
    ),
]


def _encode(record: Any) -> Any:
    if isinstance(record, WorkUnit | WorkPlan):
        return record.to_json()
    if isinstance(record, DeadLetter):
        return encode_dead_letter(record)
    return record.to_bytes()


def _decode(kind: type, data: bytes) -> Any:
    if kind is DeadLetter:
        return decode_dead_letter(data)
    return kind.from_json(data) if kind in (WorkUnit, WorkPlan) else kind.from_bytes(data)


@pytest.mark.parametrize(("record", "written"), CORPUS, ids=lambda v: type(v).__name__)
def test_the_bytes_written_before_are_written_and_read_alike(record: Any, written: Any) -> None:
    assert _encode(record) == written
    value = written[1] if isinstance(record, DeadLetter) else written
    assert _decode(type(record), value) == record


# -- bad input ----------------------------------------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.sampled_from([None, True, 1.5, -0.5, math.inf, math.nan, "", "1"]) | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=2),
    max_leaves=4,
)


def _paths(document: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Where a value sits in a JSON document: ``()``, ``("sources",)``, ``("sources", "a", 0)``, ..."""
    if isinstance(document, dict):
        items = document.items()
    elif isinstance(document, list):
        items = enumerate(document)
    else:
        return [prefix]
    return [prefix, *(path for key, value in items for path in _paths(value, (*prefix, key)))]


def _replaced(document: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    copy = dict(document) if isinstance(document, dict) else list(document)
    copy[path[0]] = _replaced(document[path[0]], path[1:], value)
    return copy


RECORDS = st.one_of(work_units(), work_plans, mixer_states, constructor_states(), dead_letters)


@settings(deadline=None, max_examples=400)
@given(record=RECORDS, data=st.data())
def test_a_replaced_value_gives_decode_error_or_a_well_formed_record(record: Any, data: st.DataObject) -> None:
    """Any JSON value anywhere in a record: ``DecodeError`` (no ``OverflowError`` for ``Infinity`` as an
    int, as the work plan and constructor state decoders gave), or a record that encodes again."""
    value = _encode(record)[1] if isinstance(record, DeadLetter) else _encode(record)
    document = json.loads(value)
    path = data.draw(st.sampled_from(_paths(document)))
    damaged = json.dumps(_replaced(document, path, data.draw(JSON_VALUES))).encode()
    try:
        decoded = _decode(type(record), damaged)
    except DecodeError:
        return
    assert type(decoded) is type(record)
    _encode(decoded)


UNIT = '{"source": "s", "path": "p", "kind": "file", "start": 0, "stop": 1'
MIXER_JSON = '{"v": 1, "step": 3, "credit": {"a": 0.5}, "long": 0.0}'


def _state(**fields: Any) -> bytes:
    body = {"v": 1, "mixer": json.loads(MIXER_JSON), "sources": {}, "deferred": [], "exhausted": [], "finished": False}
    return json.dumps(body | fields).encode()


BAD_INPUTS = [
    (WorkUnit.from_json, UNIT + ', "epoch": 1.5, "start": true}', "'start' must be int, got True; field 'epoch'"),
    (WorkUnit.from_json, UNIT + ', "row_group": "x"}', "field 'row_group' must be int or null, got 'x'"),
    (WorkUnit.from_json, UNIT + ', "epoch": -1}', "byte_offset, object_size and skip_bytes must be >= 0"),
    (WorkPlan.from_json, '{"source": "s", "units": "many", "ends": {}}', "field 'units' must be int, got 'many'"),
    (WorkPlan.from_json, '{"source": "s", "units": 1, "ends": {"x": 1}}', "field 'ends' key 'x' must be int"),
    (WorkPlan.from_json, '{"source": "s", "units": Infinity, "ends": {}}', "'units' must be a finite number"),
    (WorkPlan.from_json, '{"source": 5, "units": 1}', "missing fields ['ends']; field 'source' must be a string"),
    (MixerState.from_bytes, '{"v": 2}', "mixer state version 2, expected 1"),
    (MixerState.from_bytes, MIXER_JSON.replace("3", "-1"), "field 'step' must be >= 0, got -1"),
    (MixerState.from_bytes, MIXER_JSON.replace("0.5", "NaN"), "field 'credit.a' must be a finite number"),
    (MixerState.from_bytes, MIXER_JSON.replace("0.5", "true"), "field 'credit.a' must be a number, got True"),
    (ConstructorState.from_bytes, '{"v": 3}', "constructor state version 3, expected 1"),
    (ConstructorState.from_bytes, _state(sources={"a": [0]}), "field 'sources.a' has no item 1"),
    (ConstructorState.from_bytes, _state(sources={"a": [0, ["x"]]}), "field 'sources.a[1][0]' must be int"),
    (ConstructorState.from_bytes, _state(deferred=[[5, 1]]), "field 'deferred[0][0]' must be a string, got 5"),
    (ConstructorState.from_bytes, _state(finished="no"), "field 'finished' must be true or false, got 'no'"),
    (ConstructorState.from_bytes, _state(mixer={"v": 1, "step": 0, "credit": {}}), "missing fields ['mixer.long']"),
    (decode_dead_letter, '{"version": 1, "source": "w", "location": "a"}', "missing fields ['reason']"),
    (decode_dead_letter, '{"version": 1, "source": "w", "location": "", "reason": "", "payload": "!"}', "not base64"),
]


@pytest.mark.parametrize(("decode", "data", "message"), BAD_INPUTS)
def test_errors_name_the_field(decode: Any, data: str | bytes, message: str) -> None:
    with pytest.raises(DecodeError) as error:
        decode(data.encode() if isinstance(data, str) else data)
    assert message in str(error.value)


def test_a_record_without_a_value_raises_decode_error() -> None:
    decoders = (WorkUnit.from_json, WorkPlan.from_json, MixerState.from_bytes, ConstructorState.from_bytes)
    for decode in (*decoders, decode_dead_letter):
        with pytest.raises(DecodeError):
            decode(None)


def test_the_sink_side_imports_no_pydantic() -> None:
    """``topics`` (which the trainer sink imports) and ``connectors`` load pydantic only to decode."""
    code = "import sys, topics, connectors; print('pydantic' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
