"""The dead-letter codec: round trips; damaged input gives DecodeError or a well-formed DeadLetter.

JSON has no checksum: a flipped byte inside a string decodes to a different string. What is
guaranteed is that nothing but DecodeError escapes and that a decoded letter is well-formed."""

from __future__ import annotations

import argparse
import base64
import json

import pytest
from confluent_kafka import Message
from hypothesis import given, settings
from hypothesis import strategies as st

from topics.errors import DecodeError
from topics.formats.dead_letter import (
    DLQ_SOURCE_HEADER,
    DeadLetter,
    decode_dead_letter,
    decode_dead_letter_message,
    encode_dead_letter,
)

letters = st.builds(
    DeadLetter,
    source=st.text(max_size=20),  # surrogates included: names read from file systems may hold them
    location=st.text(max_size=40),
    reason=st.text(max_size=80),
    payload=st.none() | st.binary(max_size=64),
    error_type=st.none() | st.text(max_size=30),
    records=st.none() | st.integers(1, 2**40),
    unit=st.none() | st.text(max_size=40),
)


def assert_well_formed(letter: DeadLetter) -> None:
    assert all(isinstance(getattr(letter, f), str) for f in ("source", "location", "reason"))
    assert letter.payload is None or isinstance(letter.payload, bytes)
    assert letter.error_type is None or isinstance(letter.error_type, str)
    assert letter.records is None or (type(letter.records) is int and letter.records >= 1)
    assert letter.unit is None or isinstance(letter.unit, str)


@settings(deadline=None, max_examples=150)
@given(letter=letters)
def test_round_trip(letter: DeadLetter) -> None:
    key, value, headers = encode_dead_letter(letter)
    assert value.isascii()
    assert dict(headers)[DLQ_SOURCE_HEADER] == key
    assert decode_dead_letter(value, headers) == letter
    assert decode_dead_letter(value) == letter


@settings(deadline=None, max_examples=40)
@given(letter=letters)
def test_every_truncation_is_detected(letter: DeadLetter) -> None:
    _, value, headers = encode_dead_letter(letter)
    for end in range(len(value)):
        with pytest.raises(DecodeError):
            decode_dead_letter(value[:end], headers)


@settings(deadline=None, max_examples=150)
@given(letter=letters, data=st.data())
def test_flipped_bytes_raise_decode_error_or_give_a_well_formed_letter(letter: DeadLetter, data) -> None:
    _, value, _ = encode_dead_letter(letter)
    damaged = bytearray(value)
    for _ in range(data.draw(st.integers(1, 3))):
        damaged[data.draw(st.integers(0, len(value) - 1))] ^= data.draw(st.integers(1, 255))
    try:
        decoded = decode_dead_letter(bytes(damaged))
    except DecodeError:
        return
    assert_well_formed(decoded)


@settings(deadline=None, max_examples=150)
@given(value=st.binary(max_size=100) | st.just(b"[" * 100_000))
def test_random_bytes_raise_decode_error(value: bytes) -> None:
    with pytest.raises(DecodeError):
        decode_dead_letter(value, topic="j.dlq", partition=0, offset=1)


def _value(**fields) -> bytes:
    document = {"version": 1, "source": "web", "location": "a.jsonl:3", "reason": "no text", **fields}
    return json.dumps(document).encode()


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (_value(version=2), "version is 2; this reader knows 1"),
        (_value(version=True), "version is True"),
        (_value(source=None), "field 'source' must be a string"),
        (_value(reason=3), "field 'reason' must be a string"),
        (_value(error_type=[]), "field 'error_type' must be a string or null"),
        (_value(payload="not base64!"), "dead letter is not valid: field .payload.: not base64"),
        (b"[1, 2]", "a JSON list, not an object"),
        (b"\xff{}", "not UTF-8 JSON"),
    ],
)
def test_bad_values_are_refused(value: bytes, match: str) -> None:
    with pytest.raises(DecodeError, match=match) as error:
        decode_dead_letter(value, topic="j.dlq", partition=0, offset=41)
    assert "topic=j.dlq, partition=0, offset=41" in str(error.value)


def test_unknown_fields_are_ignored_and_source_header_is_checked() -> None:
    payload = base64.b64encode(b"\x00raw").decode()
    letter = decode_dead_letter(_value(payload=payload, added_later={"x": 1}))
    assert letter == DeadLetter("web", "a.jsonl:3", "no text", b"\x00raw")
    with pytest.raises(DecodeError, match="differs from the value's source"):
        decode_dead_letter(_value(), [(DLQ_SOURCE_HEADER, b"code")])


def test_from_exception_and_message() -> None:
    try:
        int("x")
    except ValueError as exc:
        letter = DeadLetter.from_exception("web", "a.jsonl:3", exc, payload=b"x")
    assert letter.error_type == "builtins.ValueError"
    assert "invalid literal" in letter.reason
    key, value, headers = encode_dead_letter(letter)
    message = Message(topic="j.dlq", partition=0, offset=2, key=key, value=value, headers=headers)
    assert decode_dead_letter_message(message) == letter
    with pytest.raises(DecodeError, match=r"topic=j\.dlq, partition=0, offset=3"):
        decode_dead_letter_message(Message(topic="j.dlq", partition=0, offset=3, value=b"{"))


# -- dead letters against each source's records: what `mixflow run` reports and judges --------------------


@given(
    letters=st.dictionaries(
        st.tuples(
            st.sampled_from(["a", "b", "c"]),
            st.one_of(st.text(max_size=30), st.integers(0, 99).map(lambda n: f"image needs {n} tokens")),
        ),
        st.integers(1, 50),
        max_size=30,
    ),
    records=st.dictionaries(st.sampled_from(["a", "b", "d"]), st.integers(0, 2000)),
    allowed=st.floats(0, 1),
)
def test_a_tally_keeps_every_dead_letter_under_its_source_and_the_verdict_follows_the_share(
    letters: dict[tuple[str, str], int], records: dict[str, int], allowed: float
) -> None:
    from pipeline.tools.dead_letters import REASONS_SHOWN, over_share, reason_kind, report_lines, tally

    tallies = tally(letters, records)
    by_source = {t.source: t for t in tallies}
    assert list(by_source)[: len(records)] == list(records)  # every source named, in its order, then the others
    assert set(by_source) == set(records) | {s for s, _ in letters}
    for source, t in by_source.items():
        mine = {reason: n for (s, reason), n in letters.items() if s == source}
        assert t.letters == sum(mine.values()) and t.records == records.get(source, 0)
        assert len(t.reasons) == len({reason_kind(r) for r in mine})
        shown = t.shown()
        assert sum(r.letters for r in shown) == t.letters and len(shown) <= REASONS_SHOWN + 1
    lossy = {t.source for t in over_share(tallies, allowed)}
    assert lossy == {t.source for t in tallies if t.letters and t.letters / max(t.records, t.letters) > allowed}
    lines = report_lines(tallies, allowed)
    if not letters:
        assert lines == ["dead letters: none"]
    else:
        assert lines[-1].endswith(": yes") == (not lossy)
        assert all(f"source {source} " in lines[-1] for source in lossy)


@pytest.mark.parametrize(("text", "value"), [("0", 0.0), ("0.05", 0.05), ("5%", 0.05), ("100%", 1.0), ("1", 1.0)])
def test_a_share_is_a_fraction_or_a_percentage(text: str, value: float) -> None:
    from pipeline.cli.arguments import share

    assert share(text) == pytest.approx(value)
    for wrong in ("2", "-1%", "101%", "x", "nan"):
        with pytest.raises(argparse.ArgumentTypeError):
            share(wrong)
