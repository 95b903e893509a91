"""Samples from interleaved documents: placeholder blocks, offsets, chunks that never cut a block, one tokenizer
call per build, dead letters for bad media, and text documents built the same beside interleaved ones."""

from __future__ import annotations

import itertools
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import replace
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import ByteLevelBPETokenizer

from connectors.media.decode import MediaDecoder
from connectors.media.placeholders import placeholder_block
from connectors.multimodal_samples import Segment, chunk_segments
from connectors.planning import split_file
from connectors.readers.base import Document, MediaRef
from connectors.readers.webdataset_shards import WebDatasetReader
from connectors.samples import SampleBuilder
from connectors.tokenizer import TextTokenizer
from tests.caption_shards import write_shard
from tests.media_support import VISION, clip_bytes, image_bytes, text_image
from topics.formats.media import MediaItem
from topics.formats.sample import Sample

EOD = "<|endoftext|>"
TEXTS = ["A photo of a cat.", "def f(x):\n    return x\n", "Two images follow:", "héllo wörld", "", "and a clip"]
PLACEHOLDER_IDS = {VISION.image_token_id, VISION.video_token_id}


class CountingTokenizer(TextTokenizer):
    """A real tokenizer that counts its batch calls."""

    calls = 0

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        self.calls += 1
        return super().encode_batch(texts)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> CountingTokenizer:
    trainer = ByteLevelBPETokenizer()
    trainer.train_from_iterator(TEXTS * 10, vocab_size=256 + 40, special_tokens=[EOD], show_progress=False)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    trainer.save(str(path))
    loaded = TextTokenizer.from_file(path)
    return CountingTokenizer(loaded._tokenizer, name=loaded.name)


@cache
def png(width: int, height: int) -> bytes:
    return image_bytes(text_image(width, height, f"{width}x{height}"))


def image_ref(width: int, height: int, where: str = "doc:image") -> MediaRef:
    return MediaRef("image", where, data=png(width, height))


def interleaved(row: int, *parts: str | MediaRef) -> Document:
    return Document("mm", "rows.jsonl", row, parts=tuple(parts))


def expected_tokens(tokenizer: TextTokenizer, document: Document, eod: int | None) -> np.ndarray:
    """The document's whole sequence, written out part by part."""
    decoder = MediaDecoder(VISION)
    pieces = [
        tokenizer.encode_batch([part])[0] if isinstance(part, str) else placeholder_block(decoder.decode(part), VISION)
        for part in document.parts or ()
    ]
    return np.concatenate([np.zeros(0, np.int32), *pieces, [] if eod is None else [eod]]).astype(np.int32)


def assert_blocks_whole(sample: Sample) -> None:
    """Every item's block lies inside the sample at its offset, and every placeholder belongs to an item."""
    tokens = sample.tokens
    covered = np.zeros(len(tokens), bool)
    for item in sample.media:
        at = item.token_offset
        placeholder = VISION.image_token_id if item.kind == "image" else VISION.video_token_id
        assert at >= 1 and at + item.tokens < len(tokens), f"{sample.sample_id}: a block is cut"
        assert tokens[at - 1] == VISION.vision_start_id and tokens[at + item.tokens] == VISION.vision_end_id
        assert (tokens[at : at + item.tokens] == placeholder).all()
        covered[at : at + item.tokens] = True
    assert not np.isin(tokens[~covered], list(PLACEHOLDER_IDS)).any()
    offsets = [item.token_offset for item in sample.media]
    assert offsets == sorted(offsets)


# Chunking (pure)


def synthetic_item(grid_h: int, grid_w: int, kind: str = "image") -> MediaItem:
    grid_t = 1 if kind == "image" else 2
    frames = grid_t * 2 if kind == "video" else 1
    return MediaItem(kind, grid_t, grid_h, grid_w, 2, 2, grid_h * 14, grid_w * 14, 0, "jpeg", (b"",) * frames)


segment_lists = st.lists(
    st.one_of(
        st.lists(st.integers(0, 200), max_size=40).map(lambda ts: Segment(np.array(ts, np.int32))),
        st.builds(
            lambda h, w, kind: (
                item := synthetic_item(2 * h, 2 * w, kind),
                Segment(placeholder_block(item, VISION), item),
            )[1],
            st.integers(1, 4),
            st.integers(1, 4),
            st.sampled_from(["image", "video"]),
        ),
    ),
    max_size=12,
)


@given(segment_lists, st.integers(1, 80))
def test_chunks_never_cut_a_block(segments: list[Segment], max_length: int) -> None:
    too_long = [len(s.tokens) for s in segments if s.item is not None and len(s.tokens) > max_length]
    if too_long:
        with pytest.raises(ValueError, match=f"a block of {too_long[0]} tokens does not fit in chunks of {max_length}"):
            chunk_segments(segments, max_length)
        return
    chunks = chunk_segments(segments, max_length)
    whole = np.concatenate([np.zeros(0, np.int32), *(s.tokens for s in segments)])
    assert np.concatenate([np.zeros(0, np.int32), *(tokens for tokens, _ in chunks)]).tolist() == whole.tolist()
    assert all(1 <= len(tokens) <= max_length for tokens, _ in chunks)
    items = [item for _, chunk_items in chunks for item in chunk_items]
    assert [i.grid for i in items] == [s.item.grid for s in segments if s.item is not None]
    for k, (tokens, chunk_items) in enumerate(chunks):
        assert_blocks_whole(Sample(f"s/p/0#{k}", "s", tokens, media=chunk_items))
    # Greedy: a chunk ends short only where the next one starts with a block that did not fit in it.
    for (tokens, _), (_, next_items) in itertools.pairwise(chunks):
        if len(tokens) < max_length:
            assert next_items and next_items[0].token_offset == 1
            assert len(tokens) + next_items[0].tokens + 2 > max_length


@given(segment_lists, st.integers(1, 80), st.integers(4, 200))
def test_chunks_hold_at_most_the_patch_budget(segments: list[Segment], max_length: int, max_patches: int) -> None:
    blocks = [s for s in segments if s.item is not None]
    if any(len(s.tokens) > max_length or s.item.patches > max_patches for s in blocks):
        with pytest.raises(ValueError, match="does not fit in chunks of"):
            chunk_segments(segments, max_length, max_patches)
        return
    chunks = chunk_segments(segments, max_length, max_patches)
    whole = np.concatenate([np.zeros(0, np.int32), *(s.tokens for s in segments)])
    assert np.concatenate([np.zeros(0, np.int32), *(tokens for tokens, _ in chunks)]).tolist() == whole.tolist()
    assert all(len(tokens) <= max_length and sum(i.patches for i in items) <= max_patches for tokens, items in chunks)
    # A chunk is cut early for patches only where the next block would not fit in its budget.
    for (tokens, items), (_, next_items) in itertools.pairwise(chunks):
        if len(tokens) < max_length and next_items and next_items[0].token_offset == 1:
            fits_tokens = len(tokens) + next_items[0].tokens + 2 <= max_length
            assert not fits_tokens or sum(i.patches for i in items) + next_items[0].patches > max_patches


def test_an_image_over_the_patch_budget_is_a_dead_letter(tokenizer: CountingTokenizer) -> None:
    builder = SampleBuilder(tokenizer, max_length=4096, vision=VISION, max_patches=64)
    small, large = image_bytes(text_image(56, 56)), image_bytes(text_image(448, 448))
    documents = [
        Document("s", "a.jsonl", 0, parts=(MediaRef("image", "a.jsonl:row=0:image=0", data=small), "fine")),
        Document("s", "a.jsonl", 1, parts=(MediaRef("image", "a.jsonl:row=1:image=0", data=large), "too big")),
    ]
    built = builder.build(documents)
    assert [s.sample_id for s in built.samples] == ["s/a.jsonl/0"]
    (letter,) = built.dead_letters
    assert letter.location == "a.jsonl:row=1:image=0" and "more than patches_per_micro_batch 64" in letter.reason


# The builder


def test_an_interleaved_document_becomes_text_and_blocks(tokenizer: CountingTokenizer) -> None:
    clip = MediaRef("video", "rows.jsonl:row=0:video=0", data=clip_bytes(12, rate=4))
    document = interleaved(0, TEXTS[2], image_ref(90, 60), TEXTS[0], image_ref(200, 120), clip, TEXTS[5])
    built = SampleBuilder(tokenizer, max_length=4096, eod_id=0, vision=VISION).build([document])
    assert built.dead_letters == []
    (sample,) = built.samples
    assert sample.sample_id == "mm/rows.jsonl/0" and sample.source == "mm"
    assert sample.tokens.dtype == np.int32
    assert sample.tokens.tolist() == expected_tokens(tokenizer, document, 0).tolist()
    assert [(item.kind, item.grid) for item in sample.media] == [
        ("image", (1, 4, 6)),
        ("image", (1, 8, 14)),
        ("video", (3, 4, 4)),  # 3 s at 2 frames per second
    ]
    text_0 = len(tokenizer.encode_batch([TEXTS[2]])[0])
    assert sample.media[0].token_offset == text_0 + 1
    assert_blocks_whole(sample)
    assert sample.patches == 24 + 112 + 48


@settings(max_examples=25)
@given(
    st.lists(
        st.lists(
            st.one_of(
                st.sampled_from(TEXTS),
                st.tuples(st.integers(28, 160), st.integers(28, 160)).map(lambda s: image_ref(*s)),
            ),
            max_size=6,
        ),
        min_size=1,
        max_size=5,
    ),
    st.integers(40, 200),
    st.sampled_from([None, 0]),
)
def test_documents_split_between_blocks(
    tokenizer: CountingTokenizer, documents: list[list[str | MediaRef]], max_length: int, eod: int | None
) -> None:
    batch = [interleaved(row, *parts) for row, parts in enumerate(documents)]
    builder = SampleBuilder(tokenizer, max_length=max_length, eod_id=eod, vision=VISION)
    calls = tokenizer.calls
    built = builder.build(batch)
    assert tokenizer.calls - calls <= 1  # one batched call for every text of the build
    by_document: dict[int, list[Sample]] = {}
    for sample in built.samples:
        by_document.setdefault(int(sample.sample_id.split("/")[2].split("#")[0]), []).append(sample)
        assert 1 <= sample.length <= max_length
        assert_blocks_whole(sample)
    for document in batch:
        whole = expected_tokens(tokenizer, document, eod)
        samples = by_document.get(document.row, [])
        if len(whole) == 0:
            assert [letter.reason for letter in built.dead_letters] == ["document has no tokens"] * len(
                built.dead_letters
            )
            continue
        assert np.concatenate([s.tokens for s in samples]).tolist() == whole.tolist()
        ids = [s.sample_id for s in samples]
        base = document.document_id
        assert ids == ([base] if len(ids) == 1 else [f"{base}#{k}" for k in range(len(ids))])
    assert list(by_document) == sorted(by_document)


def test_bad_media_dead_letters_its_document_and_the_others_go_on(tokenizer: CountingTokenizer) -> None:
    documents = [
        Document("mm", "rows.jsonl", 0, text=TEXTS[0]),
        interleaved(1, TEXTS[0], MediaRef("image", "rows.jsonl:row=1:image=0", data=b"not an image")),
        interleaved(2, image_ref(60, 60), TEXTS[1]),
        interleaved(3, MediaRef("video", "rows.jsonl:row=3:video=0", data=png(60, 60)), TEXTS[1]),
        interleaved(4, image_ref(1000, 1000, "rows.jsonl:row=4:image=0")),
        Document("mm", "rows.jsonl", 5, tokens=np.arange(3, dtype=np.int32)),
    ]
    built = SampleBuilder(tokenizer, max_length=600, eod_id=0, vision=VISION).build(documents)
    assert [s.sample_id for s in built.samples] == ["mm/rows.jsonl/0", "mm/rows.jsonl/2", "mm/rows.jsonl/5"]
    letters = [(d.source, d.location, d.reason, d.error_type) for d in built.dead_letters]
    media_error = "connectors.media.errors.MediaError"
    assert letters == [
        ("mm", "rows.jsonl:row=1:image=0", letters[0][2], media_error),
        ("mm", "rows.jsonl:row=3:video=0", "a still image (png_pipe), not a video", media_error),
        ("mm", "rows.jsonl:row=4:image=0", "image needs 1227 tokens, more than max_sample_length 600", media_error),
    ]
    assert "not an image Pillow can read" in letters[0][2]


def test_media_paths_are_read_under_the_root(tokenizer: CountingTokenizer, tmp_path: Path) -> None:
    (tmp_path / "a.png").write_bytes(png(56, 56))
    builder = SampleBuilder(tokenizer, max_length=100, vision=VISION, media_root=tmp_path)
    built = builder.build(
        [interleaved(0, MediaRef("image", "w", path="a.png")), interleaved(1, MediaRef("image", "x", path="b.png"))]
    )
    assert [s.tokens.tolist() for s in built.samples] == [
        [VISION.vision_start_id, *[VISION.image_token_id] * 4, VISION.vision_end_id]
    ]
    assert [(d.location, "does not exist" in d.reason) for d in built.dead_letters] == [("x", True)]


def test_configuration_errors_are_not_dead_letters(tokenizer: CountingTokenizer) -> None:
    with pytest.raises(ValueError, match="has media but no vision configuration"):
        SampleBuilder(tokenizer, max_length=100).build([interleaved(0, image_ref(56, 56))])
    with pytest.raises(ValueError, match="text needs a tokenizer"):
        SampleBuilder(None, max_length=100, vision=VISION).build([interleaved(0, "words", image_ref(56, 56))])
    media_only = SampleBuilder(None, max_length=100, vision=VISION).build([interleaved(0, image_ref(56, 56))])
    assert [s.length for s in media_only.samples] == [6]


def test_epochs_and_empty_documents(tokenizer: CountingTokenizer) -> None:
    documents = [interleaved(0, image_ref(56, 56)), interleaved(1), interleaved(2, "")]
    built = SampleBuilder(tokenizer, max_length=4, vision=VISION).build(documents, epoch=2)
    assert built.samples == [] or [s.sample_id for s in built.samples] == []
    assert [d.location for d in built.dead_letters] == ["doc:image", "rows.jsonl:row=1", "rows.jsonl:row=2"]
    assert built.dead_letters[0].reason == "image needs 6 tokens, more than max_sample_length 4"
    with_eod = SampleBuilder(tokenizer, max_length=6, eod_id=0, vision=VISION).build(documents, epoch=2)
    assert [s.sample_id for s in with_eod.samples] == [
        "mm/rows.jsonl/0#0@e2",
        "mm/rows.jsonl/0#1@e2",
        "mm/rows.jsonl/1@e2",
        "mm/rows.jsonl/2@e2",
    ]
    assert with_eod.samples[1].tokens.tolist() == [0] and with_eod.samples[1].media == ()


# The text path


text_documents = st.lists(
    st.one_of(
        st.sampled_from(TEXTS).map(lambda t: ("text", t)),
        st.lists(st.integers(0, 299), max_size=30).map(lambda ts: ("tokens", ts)),
    ),
    min_size=1,
    max_size=8,
)


def as_document(row: int, kind_value: tuple[str, object]) -> Document:
    kind, value = kind_value
    if kind == "text":
        return Document("mm", "flat.jsonl", row, text=value)  # type: ignore[arg-type]
    return Document("mm", "flat.jsonl", row, tokens=np.array(value, np.int32))


def same(a: Sequence[Sample], b: Sequence[Sample]) -> bool:
    return [(s.sample_id, s.source, s.tokens.tolist(), s.media) for s in a] == [
        (s.sample_id, s.source, s.tokens.tolist(), s.media) for s in b
    ]


@settings(max_examples=40)
@given(text_documents, st.integers(1, 12), st.sampled_from([None, 0]), st.integers(0, 2))
def test_text_documents_build_the_same_beside_interleaved_ones(
    tokenizer: CountingTokenizer, values: list[tuple[str, object]], max_length: int, eod: int | None, epoch: int
) -> None:
    flat = [as_document(row, value) for row, value in enumerate(values)]
    builder = SampleBuilder(tokenizer, max_length=max_length, eod_id=eod, vision=VISION)
    alone = builder.build(flat, epoch=epoch)
    # The same texts as interleaved documents of one text part each chunk the same way.
    as_parts = [Document("mm", "flat.jsonl", d.row, parts=(d.text,)) if d.text is not None else d for d in flat]
    assert same(builder.build(as_parts, epoch=epoch).samples, alone.samples)
    mixed = builder.build([*flat, interleaved(len(flat), TEXTS[0])], epoch=epoch)
    assert same([s for s in mixed.samples if s.sample_id.startswith("mm/flat.jsonl/")], alone.samples)
    assert mixed.dead_letters == alone.dead_letters
    assert all(s.media == () for s in alone.samples)


def test_a_text_build_loads_no_media_library(tmp_path: Path) -> None:
    code = (
        "import sys, numpy as np\n"
        "from connectors.samples import SampleBuilder\n"
        "from connectors.readers.base import Document\n"
        "document = Document('s', 'f', 0, tokens=np.arange(9, dtype=np.int32))\n"
        "SampleBuilder(None, max_length=4, eod_id=0).build([document])\n"
        "media = [m for m in sys.modules if m.split('.')[0] in ('PIL', 'av') or m.startswith('connectors.media.')]\n"
        "print(sorted(media))\n"
    )
    env = {"PYTHONPATH": str(Path(__file__).resolve().parent.parent), "PATH": ""}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=True
    )
    assert done.stdout.strip() == "['connectors.media.config']"


def test_interleaved_items_carry_the_decoded_pixels(tokenizer: CountingTokenizer) -> None:
    ref = image_ref(120, 80)
    (sample,) = (
        SampleBuilder(tokenizer, max_length=200, vision=replace(VISION, encoding="png"))
        .build([interleaved(0, "x", ref)])
        .samples
    )
    decoded = MediaDecoder(replace(VISION, encoding="png")).decode(ref)
    assert sample.media == (replace(decoded, token_offset=sample.media[0].token_offset),)


def test_a_text_holding_a_vision_token_is_a_dead_letter(tokenizer: CountingTokenizer, tmp_path: Path) -> None:
    class VisionTokenInText(CountingTokenizer):
        def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
            encoded = super().encode_batch(texts)
            return [
                np.append(e, VISION.vision_start_id).astype(np.int32) if "<v>" in t else e
                for t, e in zip(texts, encoded, strict=True)
            ]

    literal = VisionTokenInText(tokenizer._tokenizer)
    builder = SampleBuilder(literal, max_length=100, vision=VISION)
    built = builder.build([interleaved(0, "a <v> b", image_ref(56, 56)), interleaved(1, "fine", image_ref(56, 56))])
    assert [s.sample_id for s in built.samples] == ["mm/rows.jsonl/1"]
    reason = "text part 0 holds the vision token 252 (vision_start_id); only media may place vision tokens"
    assert [(d.location, d.reason) for d in built.dead_letters] == [("rows.jsonl:row=0", reason)]
    # a WebDataset sample's letter names its key, as the reader's own letters do
    write_shard(
        tmp_path / "s.tar",
        [("k0.png", png(56, 56)), ("k0.txt", b"fine"), ("k1.png", png(56, 56)), ("k1.txt", b"a <v> b")],
    )
    reader = WebDatasetReader("wds", tmp_path)
    documents = [
        d for layout in reader.layouts() for unit in split_file("wds", layout, 1 << 40) for d in reader.read(unit)
    ]
    built = builder.build(documents)
    assert [s.sample_id for s in built.samples] == ["wds/s.tar/0"]
    assert [(d.location, d.reason) for d in built.dead_letters] == [
        ("s.tar:key=k1", reason.replace("part 0", "part 1"))
    ]
