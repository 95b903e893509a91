"""Conversation records as LLaVA-Instruct and ShareGPT store them: turns rendered, media at their placeholders,
the loss on the assistant's turns."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import matplotlib.cbook
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import ByteLevelBPETokenizer

from connectors.planning import split_file
from connectors.readers import Document, MediaRef, make_reader
from connectors.readers.chat_parts import ChatError, chat_content
from connectors.samples import SampleBuilder
from connectors.tokenizer import TextTokenizer
from tests.media_support import VISION
from topics.formats.dead_letter import DeadLetter
from topics.formats.loss_spans import LOSS_SPANS_KEY
from topics.formats.sample import Sample

EOD = "<|endoftext|>"
SAMPLE_IMAGES = ("grace_hopper.jpg", "Minduka_Present_Blue_Pack.png", "logo2.png")
ROLE_NAMES = {"human": "USER", "user": "USER", "gpt": "ASSISTANT", "assistant": "ASSISTANT", "system": "SYSTEM"}


def real_image(name: str) -> Path:
    """One of matplotlib's sample images, a real photograph or drawing on this machine."""
    with matplotlib.cbook.get_sample_data(name) as file:
        return Path(file.name)


def read_all(root: Path, glob: str = "*.jsonl") -> list[Document | DeadLetter]:
    reader = make_reader("jsonl", "llava", root, glob, content="media")
    return [
        item
        for layout in reader.layouts()
        for unit in split_file("llava", layout, 1 << 40)
        for item in reader.read(unit)
    ]


def rendering(parts: tuple[Any, ...], trained: frozenset[int]) -> tuple[str, str]:
    """The document as text with each medium as its placeholder, and the text that takes the loss."""
    text = "".join(f"<{p.kind}>" if isinstance(p, MediaRef) else p for p in parts)
    return text, "".join(parts[k] for k in sorted(trained))


def test_llava_instruct_records(tmp_path: Path) -> None:
    images = tmp_path / "coco" / "train2017"
    images.mkdir(parents=True)
    for name in SAMPLE_IMAGES[:2]:
        shutil.copy(real_image(name), images / name)
    rows = [
        {
            "id": "000000033471",
            "image": "coco/train2017/grace_hopper.jpg",
            "conversations": [
                {"from": "human", "value": "<image>\nWho is in the picture?"},
                {"from": "gpt", "value": "A woman in a naval uniform."},
                {"from": "human", "value": "What is she wearing?"},
                {"from": "gpt", "value": "A uniform with medals."},
            ],
        },
        {  # no placeholder: the image goes first, as LLaVA puts it
            "id": "2",
            "image": "coco/train2017/Minduka_Present_Blue_Pack.png",
            "conversations": [{"from": "human", "value": "Describe it."}, {"from": "gpt", "value": "A box."}],
        },
        {  # text-only, as in llava_v1_5_mix665k
            "id": "sharegpt-1",
            "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello!"}],
        },
        {"id": "4", "image": "a.jpg", "conversations": [{"from": "human", "value": "<image> <image>"}]},
        {"id": "5", "conversations": [{"from": "human", "value": "Hi"}]},
        {"id": "6", "conversations": [{"from": "robot", "value": "Hi"}, {"from": "gpt", "value": "x"}]},
    ]
    (tmp_path / "llava_instruct.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    items = read_all(tmp_path)
    docs = [i for i in items if isinstance(i, Document)]
    assert [rendering(d.parts, d.trained) for d in docs] == [  # type: ignore[arg-type]
        (
            "USER: <image>\nWho is in the picture?\nASSISTANT: A woman in a naval uniform.\n"
            "USER: What is she wearing?\nASSISTANT: A uniform with medals.\n",
            "A woman in a naval uniform.\nA uniform with medals.\n",
        ),
        ("USER: <image>\nDescribe it.\nASSISTANT: A box.\n", "A box.\n"),
        ("USER: Hi\nASSISTANT: Hello!\n", "Hello!\n"),
    ]
    where, path = "llava_instruct.jsonl:row=0:image=0", "coco/train2017/grace_hopper.jpg"
    assert docs[0].parts[1] == MediaRef("image", where, path=path)  # type: ignore[index]
    letters = {i.location: i.reason for i in items if isinstance(i, DeadLetter)}
    assert letters == {
        "llava_instruct.jsonl:row=3": "conversation has 2 <image> placeholders for 1 images",
        "llava_instruct.jsonl:row=4": "conversation has no assistant turn with text",
        "llava_instruct.jsonl:row=5": "turn 0 has role 'robot', not one of human, user, gpt, assistant, system",
    }


def test_sharegpt_messages_with_content_items(tmp_path: Path) -> None:
    rows = [
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "A logo."}]},
            ],
            "images": ["logo2.png"],
        },
        {"messages": [{"role": "user", "content": "<image>Hi"}, {"role": "assistant", "content": "Yo"}], "images": []},
        {"messages": [{"role": "user", "content": [{"type": "audio"}]}, {"role": "assistant", "content": "x"}]},
    ]
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    items = read_all(tmp_path)
    (doc,) = [i for i in items if isinstance(i, Document)]
    assert rendering(doc.parts, doc.trained) == (  # type: ignore[arg-type]
        "SYSTEM: Be brief.\nUSER: <image>What is this?\nASSISTANT: A logo.\n",
        "A logo.\n",
    )
    assert [(i.location, i.reason) for i in items if isinstance(i, DeadLetter)] == [
        ("chat.jsonl:row=1", "conversation has 1 <image> placeholders for 0 images"),
        ("chat.jsonl:row=2", "turn 0 item 0 is not a text, image or video item"),
    ]


words = st.text(st.sampled_from("ab <>\nx"), max_size=8).filter(lambda t: "<image>" not in t and "<video>" not in t)
turn_texts = st.lists(st.one_of(words, st.just("<image>"), st.just("<video>")), max_size=4).map("".join)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(sorted(ROLE_NAMES)), turn_texts), min_size=1, max_size=6))
def test_rendering_places_media_and_trains_assistant_text(turns: list[tuple[str, str]]) -> None:
    record = [{"from": role, "value": text} for role, text in turns]
    media = {
        kind: [
            MediaRef(kind, f"r:{kind}={k}", path=f"{kind}{k}")
            for k in range(sum(t.count(f"<{kind}>") for _, t in turns))
        ]
        for kind in ("image", "video")
    }
    expected = "".join(f"{ROLE_NAMES[role]}: {text}\n" for role, text in turns)
    spoken = [text.replace("<image>", "").replace("<video>", "") for _, text in turns]
    learnt = "".join(
        f"{said}\n" for (role, _), said in zip(turns, spoken, strict=True) if ROLE_NAMES[role] == "ASSISTANT"
    )
    if not learnt.strip("\n"):
        with pytest.raises(ChatError, match="no assistant turn"):
            chat_content(record, media)
        return
    content = chat_content(record, media)
    assert rendering(content.parts, content.trained) == (expected, learnt)
    for kind, refs in media.items():  # every medium once, in order
        assert [p for p in content.parts if isinstance(p, MediaRef) and p.kind == kind] == refs
    assert all(isinstance(content.parts[k], str) for k in content.trained)
    # adjacent text parts differ in whether they take the loss
    pairs = [(k - 1, k) for k in range(1, len(content.parts))]
    strings = [(a, b) for a, b in pairs if isinstance(content.parts[a], str) and isinstance(content.parts[b], str)]
    assert all((a in content.trained) != (b in content.trained) for a, b in strings)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> TextTokenizer:
    trainer = ByteLevelBPETokenizer()
    texts = ["USER: Who is in the picture?", "ASSISTANT: A woman in a naval uniform.", "Describe it. A box."]
    trainer.train_from_iterator(texts * 10, vocab_size=256 + 40, special_tokens=[EOD], show_progress=False)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    trainer.save(str(path))
    return TextTokenizer.from_file(path)


def span_tokens(sample: Sample) -> np.ndarray:
    spans = [span.split(":") for span in sample.metadata[LOSS_SPANS_KEY].split(",") if span]
    return np.concatenate([np.zeros(0, np.int32), *(sample.tokens[int(a) : int(b)] for a, b in spans)])


@pytest.mark.parametrize("max_length", [24, 48, 4096])
def test_conversation_samples_name_the_assistant_tokens(
    tmp_path: Path, tokenizer: TextTokenizer, max_length: int
) -> None:
    shutil.copy(real_image("logo2.png"), tmp_path / "logo2.png")
    turns = [
        {"from": "human", "value": "Who is in the picture?\n<image>"},
        {"from": "gpt", "value": "A woman in a naval uniform."},
        {"from": "human", "value": "Describe it."},
        {"from": "gpt", "value": "A box."},
    ]
    (tmp_path / "c.jsonl").write_text(json.dumps({"id": "1", "image": "logo2.png", "conversations": turns}) + "\n")
    (document,) = read_all(tmp_path)
    eod = tokenizer.token_id(EOD)
    vision = dataclasses.replace(VISION, max_pixels=28 * 28 * 16)  # a block of at most 16 tokens and its ends
    builder = SampleBuilder(tokenizer, max_length=max_length, eod_id=eod, vision=vision, media_root=tmp_path)
    built = builder.build([document])  # type: ignore[list-item]
    assert not built.dead_letters and (len(built.samples) > 1) == (max_length < 4096)
    learnt = np.concatenate([span_tokens(sample) for sample in built.samples])
    assert tokenizer.decode(learnt[:-1]) == "A woman in a naval uniform.\nA box.\n" and learnt[-1] == eod
    for sample in built.samples:  # no placeholder block takes the loss
        assert not np.isin(span_tokens(sample), [vision.image_token_id, vision.vision_start_id]).any()


def test_llava_onevision_parquet(tmp_path: Path) -> None:
    """Conversations in Parquet as LLaVA-OneVision-Data lays them out: ``id``, an ``Image()`` struct column
    ``image`` and ``conversations`` a ``list<struct<from, value>>``."""
    image = real_image("logo2.png").read_bytes()
    turns = [[{"from": "human", "value": "<image>\nWhat is shown?"}, {"from": "gpt", "value": "A logo."}]]
    table = pa.table(
        {
            "id": ["ov-0"],
            "image": pa.array(
                [{"bytes": image, "path": "logo2.png"}], pa.struct([("bytes", pa.binary()), ("path", pa.string())])
            ),
            "conversations": pa.array(turns, pa.list_(pa.struct([("from", pa.string()), ("value", pa.string())]))),
            "data_source": ["sample"],
        }
    )
    pq.write_table(table, tmp_path / "train-00000-of-00001.parquet")
    reader = make_reader("parquet", "ov", tmp_path, content="media")
    (doc,) = [
        item for layout in reader.layouts() for unit in split_file("ov", layout, 1 << 40) for item in reader.read(unit)
    ]
    assert isinstance(doc, Document)
    assert rendering(doc.parts, doc.trained) == ("USER: <image>\nWhat is shown?\nASSISTANT: A logo.\n", "A logo.\n")  # type: ignore[arg-type]
    assert doc.parts[1] == MediaRef("image", "train-00000-of-00001.parquet:row=0:image=0", data=image)  # type: ignore[index]
