"""A job of LLaVA and ShareGPT conversations on the real broker, loaded by a loader process, built by the
constructor and read by the trainer sink: the trainer's labels are -100 on every user and system turn, role
prefix and image placeholder, and the assistant's tokens (with the newline ending each turn, and the
end-of-document token) everywhere else, in the sink's own labels and in the HF Trainer's."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from tokenizers import ByteLevelBPETokenizer, Tokenizer

from pipeline.spec import load_spec
from tests.loader_support import start_loader, wait_all
from tests.media_support import image_bytes, text_image
from tests.replay_support import construct
from trainer_sink import KafkaBatchDataset, ReadOptions
from trainer_sink.integrations.hf_trainer import padding_free_batch

VISION_IDS = {"vision_start_id": 300, "vision_end_id": 301, "image_token_id": 302, "video_token_id": 303}
ASKED = ["what is drawn here", "which colour is it", "tell me more", "is it large", "where is it"]
ANSWERED = ["a square", "mostly blue", "nothing else", "quite small", "near the top"]
EOD = "<eod>"


def _conversations(folder: Path, rng: np.random.Generator) -> list[tuple[str, list[str], list[str]]]:
    """LLaVA-Instruct records (some with an image, some text-only as ShareGPT's) and ``messages`` records with a
    system turn, written to ``chats/chats.jsonl``; per record its id, user (and system) texts and answers."""
    (folder / "chats" / "images").mkdir(parents=True)
    rows, expected = [], []
    for k in range(18):
        turns = int(rng.integers(1, 4))
        asked = [ASKED[int(i)] for i in rng.integers(0, len(ASKED), turns)]
        answered = [ANSWERED[int(i)] + f" {k}" for i in rng.integers(0, len(ANSWERED), turns)]
        image = k % 3 != 1
        if image:
            (folder / "chats" / "images" / f"{k}.png").write_bytes(image_bytes(text_image(56, 84, f"img {k}")))
        if k % 3 == 2:
            content: list[dict] = [{"type": "image"}, {"type": "text", "text": asked[0]}]
            messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": content}]
            messages += [{"role": "assistant", "content": answered[0]}]
            for q, a in zip(asked[1:], answered[1:], strict=True):
                messages += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
            rows.append({"messages": messages, "images": [f"images/{k}.png"]})
            expected.append((f"chat/chats.jsonl/{k}", ["be brief", *asked], answered))
            continue
        conversation = []
        for j, (q, a) in enumerate(zip(asked, answered, strict=True)):
            conversation += [{"from": "human", "value": ("<image>\n" if image and j == 0 else "") + q}]
            conversation += [{"from": "gpt", "value": a}]
        rows.append({"id": str(k), **({"image": f"images/{k}.png"} if image else {}), "conversations": conversation})
        expected.append((f"chat/chats.jsonl/{k}", asked, answered))
    (folder / "chats" / "chats.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    trainer = ByteLevelBPETokenizer()
    words = [*ASKED, *ANSWERED, "USER: ", "ASSISTANT: ", "SYSTEM: ", "be brief"]
    trainer.train_from_iterator(words * 20, vocab_size=256 + 40, special_tokens=[EOD], show_progress=False)
    trainer.save(str(folder / "tokenizer.json"))
    return expected


def _spec(folder: Path, job: str, bootstrap: str, eod: int) -> Path:
    vision = {**VISION_IDS, "min_pixels": 28 * 28, "max_pixels": 56 * 56}
    body = {
        "job": job,
        "kafka": {"bootstrap_servers": bootstrap},
        "tokenizer": str(folder / "tokenizer.json"),
        "sources": [{"name": "chat", "reader": "jsonl", "path": str(folder / "chats"), "vision": vision}],
        "mixture": {"weights": {"chat": 1}},
        "step": {"ranks": 2, "micro_batches": 2, "tokens_per_micro_batch": 256, "patches_per_micro_batch": 400},
        "cost": {"alpha": 1.0, "beta": 100.0, "vision": {"alpha": 2.0, "beta": 300.0}},
        "seed": 3,
        "on_exhausted": "renormalize",
    }
    body["sources"][0]["eod_token_id"] = eod
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


@pytest.mark.kafka
def test_the_trainer_learns_only_the_assistants_tokens(kafka_bootstrap: str, unique_name: str, tmp_path: Path) -> None:
    expected = _conversations(tmp_path, np.random.default_rng(4))
    tokenizer = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    eod = tokenizer.token_to_id(EOD)
    spec_path = _spec(tmp_path, unique_name, kafka_bootstrap, eod)
    wait_all([start_loader(spec_path, "chat", 0, tmp_path)], 240, tmp_path)
    assert construct(load_spec(spec_path)).finished
    learnt: dict[str, np.ndarray] = {}
    unlearnt: dict[str, np.ndarray] = {}
    hf_targets: dict[int, list[int]] = defaultdict(list)
    for rank in range(2):
        sink = KafkaBatchDataset(
            job=unique_name, bootstrap_servers=kafka_bootstrap, rank=rank, read=ReadOptions(wait_timeout_s=30)
        )
        for micro in sink:
            tokens, labels, bounds = micro["input_ids"].numpy(), micro["labels"].numpy(), micro["cu_seqlens"].numpy()
            for j, sample_id in enumerate(micro["sample_ids"]):
                t, lab = tokens[bounds[j] : bounds[j + 1]], labels[bounds[j] : bounds[j + 1]]
                taken = lab != -100
                assert (lab[taken] == t[1:][taken[:-1]]).all() and not taken[-1], sample_id
                learnt[sample_id] = t[1:][taken[:-1]]
                unlearnt[sample_id] = np.concatenate([t[:1], t[1:][~taken[:-1]]])
            hf = padding_free_batch(micro)["labels"][0]
            hf_targets[rank] += hf[hf != -100].tolist()
            assert sorted(hf[hf != -100].tolist()) == sorted(labels[labels != -100].tolist())
    assert sorted(learnt) == sorted(sample_id for sample_id, _, _ in expected), "a conversation lost or split"
    vision = list(VISION_IDS.values())
    for sample_id, asked, answered in expected:
        targets, rest = learnt[sample_id], unlearnt[sample_id]
        assert targets[-1] == eod and not np.isin(targets, vision).any(), sample_id
        assert tokenizer.decode(targets[:-1].tolist()) == "".join(f"{a}\n" for a in answered), sample_id
        text = tokenizer.decode([int(t) for t in rest if t not in vision])
        assert all(q in text for q in asked) and not any(a in text for a in answered), (sample_id, text)
        assert text.count("USER: ") == len(answered) and text.count("ASSISTANT: ") == len(answered), text
    assert sum(len(v) for v in hf_targets.values()) == sum(len(v) for v in learnt.values())
    assert torch.cat([torch.tensor(v) for v in learnt.values()]).numel() > 50
