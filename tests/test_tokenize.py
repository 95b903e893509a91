"""Tokenization, the end-of-document token, chunking of long documents, and the sample id grammar."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from tokenizers import ByteLevelBPETokenizer, Tokenizer
from tokenizers.processors import TemplateProcessing

from connectors.readers import Document
from connectors.sample_ids import SampleId, document_id, parse_sample_id, sample_id
from connectors.samples import SampleBuilder, chunk_bounds
from connectors.tokenizer import TextTokenizer, TokenizerError

EOD = "<|endoftext|>"
TEXTS = ["def add(a, b):\n    return a + b\n", "The quick brown fox jumps over the lazy dog.", "héllo wörld"] * 20


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    trainer = ByteLevelBPETokenizer()
    trainer.train_from_iterator(TEXTS, vocab_size=300, special_tokens=[EOD], show_progress=False)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    trainer.save(str(path))
    return path


@pytest.fixture
def tokenizer(tokenizer_path: Path) -> TextTokenizer:
    return TextTokenizer.from_file(tokenizer_path)


def doc(row: int, text: str) -> Document:
    return Document("src", "dir/f.jsonl", row, text=text)


def test_encode_batch_matches_the_tokenizer(tokenizer: TextTokenizer, tokenizer_path: Path) -> None:
    reference = Tokenizer.from_file(str(tokenizer_path))
    encoded = tokenizer.encode_batch(TEXTS[:3])
    assert all(a.dtype == np.int32 for a in encoded)
    assert [a.tolist() for a in encoded] == [reference.encode(t).ids for t in TEXTS[:3]]
    assert tokenizer.decode(encoded[2]) == TEXTS[2]
    assert tokenizer.encode_batch([]) == []
    assert tokenizer.token_id(EOD) == 0


def test_special_tokens_only_when_configured(tokenizer_path: Path) -> None:
    raw = Tokenizer.from_file(str(tokenizer_path))
    raw.post_processor = TemplateProcessing(single=f"{EOD} $A", special_tokens=[(EOD, 0)])
    plain, marked = TextTokenizer(raw), TextTokenizer(raw, add_special_tokens=True)
    assert plain.encode_batch(["fox"])[0][0] != 0
    assert marked.encode_batch(["fox"])[0].tolist() == [0, *plain.encode_batch(["fox"])[0].tolist()]


def test_tokenizer_load_errors(tmp_path: Path, tokenizer: TextTokenizer) -> None:
    with pytest.raises(TokenizerError, match="does not exist"):
        TextTokenizer.from_file(tmp_path / "missing.json")
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(TokenizerError, match=r"broken\.json"):
        TextTokenizer.from_file(tmp_path / "broken.json")
    with pytest.raises(TokenizerError, match="not in the vocabulary"):
        tokenizer.token_id("<|nope|>")


def test_long_documents_are_split_with_eod(tokenizer: TextTokenizer) -> None:
    long_text = " ".join(TEXTS[:6])
    builder = SampleBuilder(tokenizer, max_length=7, eod_id=0)
    samples, dead = builder.build([doc(0, "fox"), doc(1, long_text)])
    assert dead == []
    expected = np.concatenate([tokenizer.encode_batch([long_text])[0], [0]])
    chunks = [s for s in samples if s.sample_id.startswith("src/dir/f.jsonl/1")]
    assert [s.sample_id for s in chunks] == [f"src/dir/f.jsonl/1#{k}" for k in range(len(chunks))]
    assert len(chunks) == -(-len(expected) // 7)
    assert all(0 < s.length <= 7 and s.tokens.dtype == np.int32 for s in chunks)
    assert np.concatenate([s.tokens for s in chunks]).tolist() == expected.tolist()
    assert samples[0].sample_id == "src/dir/f.jsonl/0"
    assert samples[0].tokens[-1] == 0
    assert all(s.source == "src" for s in samples)


def test_later_epochs_get_a_suffix(tokenizer: TextTokenizer) -> None:
    builder = SampleBuilder(tokenizer, max_length=4)
    samples, _ = builder.build([doc(3, "The quick brown fox jumps")], epoch=1)
    assert [s.sample_id for s in samples][:2] == ["src/dir/f.jsonl/3#0@e1", "src/dir/f.jsonl/3#1@e1"]
    assert parse_sample_id(samples[1].sample_id) == SampleId("src", "dir/f.jsonl", 3, chunk=1, epoch=1)


def test_pre_tokenized_documents_bypass_the_tokenizer() -> None:
    tokens = np.arange(10, dtype=np.int32)
    builder = SampleBuilder(None, max_length=100, eod_id=99)
    samples, _ = builder.build([Document("src", "a.parquet", 0, tokens=tokens)])
    assert samples[0].tokens.tolist() == [*range(10), 99]
    with pytest.raises(ValueError, match="needs a tokenizer"):
        builder.build([doc(0, "text")])


def test_empty_document_is_a_dead_letter_unless_eod(tokenizer: TextTokenizer) -> None:
    samples, dead = SampleBuilder(tokenizer, max_length=8).build([doc(0, ""), doc(1, "fox")])
    assert [s.sample_id for s in samples] == ["src/dir/f.jsonl/1"]
    assert [(d.location, d.reason) for d in dead] == [("dir/f.jsonl:row=0", "document has no tokens")]
    samples, dead = SampleBuilder(tokenizer, max_length=8, eod_id=0).build([doc(0, "")])
    assert samples[0].tokens.tolist() == [0] and dead == []
    whole_file = Document("src", "dir/f.txt", 0, text="", where="dir/f.txt")  # as the text reader names its files
    _, dead = SampleBuilder(tokenizer, max_length=8).build([whole_file])
    assert [(d.location, d.reason) for d in dead] == [("dir/f.txt", "document has no tokens")]


def test_builder_arguments_checked() -> None:
    with pytest.raises(ValueError, match="max_length"):
        SampleBuilder(None, max_length=0)
    with pytest.raises(ValueError, match="eod_id"):
        SampleBuilder(None, max_length=8, eod_id=-1)


@given(st.lists(st.integers(0, 50), max_size=20), st.integers(1, 16))
def test_chunk_bounds_cover_each_document(lengths: list[int], max_length: int) -> None:
    doc_index, chunk, start, stop = chunk_bounds(np.array(lengths, dtype=np.int64), max_length)
    assert np.all((stop - start > 0) & (stop - start <= max_length))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(int)
    for d, length in enumerate(lengths):
        mine = doc_index == d
        assert chunk[mine].tolist() == list(range(-(-length // max_length)))
        covered = [i for lo, hi in zip(start[mine], stop[mine], strict=True) for i in range(lo, hi)]
        assert covered == list(range(offsets[d], offsets[d] + length))


names = st.text(st.characters(codec="utf-8", exclude_characters="/\\"), min_size=1, max_size=8)


@given(
    source=names,
    segments=st.lists(names, min_size=1, max_size=3),
    row=st.integers(0, 10**9),
    chunk=st.none() | st.integers(0, 1000),
    epoch=st.integers(0, 50),
)
def test_sample_ids_round_trip(source: str, segments: list[str], row: int, chunk: int | None, epoch: int) -> None:
    path = "/".join(segments)
    text = sample_id(source, path, row, chunk=chunk, epoch=epoch)
    assert parse_sample_id(text) == SampleId(source, path, row, chunk, epoch)
    assert str(parse_sample_id(text)) == text
    assert parse_sample_id(text).base == document_id(source, path, row)


@pytest.mark.parametrize("bad", ["src", "src/3", "src/a/x", "src/a/01", "src/a/1#", "src/a/1@e0", "/a/1", "s//1"])
def test_malformed_sample_ids_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="sample id"):
        parse_sample_id(bad)


def test_id_parts_are_checked() -> None:
    with pytest.raises(ValueError, match="no '/'"):
        sample_id("a/b", "f.txt", 0)
    with pytest.raises(ValueError, match="relative"):
        sample_id("a", "/abs/f.txt", 0)
    with pytest.raises(ValueError, match="chunk"):
        sample_id("a", "f.txt", 0, chunk=-1)
