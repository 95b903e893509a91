"""A vision-language model consumes the sink's micro-batches as they are: a tiny randomly initialised Qwen2-VL
(transformers 5.x, float64, SDPA attention, no weights downloaded) gives a packed micro-batch of several
samples (images of different sizes, a clip, a JPEG image, a text-only sample) the same loss, token for token,
as it gives each sample run alone through its own processor path (its image processor's pixel values, its
own ``get_rope_index`` positions). The model's vision path is not bypassed: it patch-embeds ``pixel_values``
and scatters its features onto the placeholder tokens itself.

Packed samples: transformers 5.x takes ``position_ids`` of 4 rows, the text positions first; where they restart
it starts a new sequence and builds a block-causal mask (``find_packed_sequence_indices``), so no attention mask
is passed. SDPA runs in float64 throughout on the CPU; eager attention takes its softmax in float32, which
leaves differences of about 1e-8 between the packed and the lone runs."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

from tests.sink_media_support import (
    IMAGE_TOKEN,
    MERGE,
    PATCH,
    TEMPORAL,
    VIDEO_TOKEN,
    VISION_END,
    VISION_START,
    VOCAB,
    media_sample,
)
from tests.test_media_packing import image_processor, reference_video_patches
from topics.formats.batch import Batch
from topics.formats.batch_codec import decode_batch, encode_batch
from topics.formats.media_pixels import frames_array
from topics.formats.packing import IGNORE_INDEX
from topics.formats.sample import Sample
from trainer_sink import Layout, micro_batch_tensors

PAD_TOKEN = 0


@functools.cache
def tiny_qwen2_vl() -> Qwen2VLForConditionalGeneration:
    config = Qwen2VLConfig(
        text_config={
            "vocab_size": VOCAB,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 4096,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
            "bos_token_id": None,
            "eos_token_id": None,
        },
        vision_config={
            "depth": 2,
            "embed_dim": 32,
            "hidden_size": 64,
            "num_heads": 4,
            "mlp_ratio": 2,
            "patch_size": PATCH,
            "spatial_merge_size": MERGE,
            "temporal_patch_size": TEMPORAL,
        },
        image_token_id=IMAGE_TOKEN,
        video_token_id=VIDEO_TOKEN,
        vision_start_token_id=VISION_START,
        vision_end_token_id=VISION_END,
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return Qwen2VLForConditionalGeneration(config).to(torch.float64).eval()


def _samples() -> list[Sample]:
    rng = np.random.default_rng(11)
    return [
        media_sample(rng, "vl/a", [("image", (1, 4, 6))], text=(2, 9)),
        media_sample(rng, "vl/b", [("image", (1, 2, 2)), ("image", (1, 6, 4))], text=(1, 7)),
        media_sample(rng, "vl/c", [("video", (2, 2, 4))], text=(3, 6)),
        Sample("text/d", "text", rng.integers(0, 280, 17, dtype=np.int32)),
        media_sample(rng, "vl/e", [("video", (3, 2, 2)), ("image", (1, 4, 2))], text=(2, 5)),
        media_sample(rng, "vl/f", [("image", (1, 2, 4))], encoding="jpeg", text=(4, 8)),
    ]


def _forward(model: Qwen2VLForConditionalGeneration, input_ids: torch.Tensor, **inputs) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=input_ids[None].long(), use_cache=False, **inputs).logits[0]


def _alone_losses(model: Qwen2VLForConditionalGeneration, sample: Sample) -> torch.Tensor:
    """Per-token loss of the sample run by itself, its inputs made the model's own way: pixel values by its image
    processor (clips: its video processor's patch order), positions by its ``get_rope_index``."""
    ids = torch.from_numpy(sample.tokens.astype(np.int64))
    images = [it for it in sample.media if it.kind == "image"]
    videos = [it for it in sample.media if it.kind == "video"]
    inputs: dict = {"mm_token_type_ids": ((ids == IMAGE_TOKEN).int() + 2 * (ids == VIDEO_TOKEN).int())[None]}
    if images:
        processed = image_processor()([frames_array(it)[0] for it in images], do_resize=False, return_tensors="pt")
        inputs.update(pixel_values=processed["pixel_values"], image_grid_thw=processed["image_grid_thw"])
    if videos:
        patches = np.concatenate([reference_video_patches(frames_array(it)) for it in videos])
        inputs.update(
            pixel_values_videos=torch.from_numpy(patches), video_grid_thw=torch.tensor([v.grid for v in videos])
        )
    logits = _forward(model, ids, **inputs)
    return F.cross_entropy(logits[:-1], ids[1:], reduction="none")


def _packed_losses(model: Qwen2VLForConditionalGeneration, tensors: dict) -> torch.Tensor:
    """Per-token loss of a micro-batch of the sink, given to the model as it comes: the 4-row position ids
    (text positions, from which the model keeps attention within each sample, then the 3-D ones)."""
    inputs: dict = {
        "position_ids": torch.cat([tensors["position_ids"][None], tensors["mrope_position_ids"]]).long()[:, None],
    }
    if tensors["image_grid_thw"].numel():
        inputs.update(pixel_values=tensors["pixel_values"], image_grid_thw=tensors["image_grid_thw"])
    if tensors["video_grid_thw"].numel():
        inputs.update(pixel_values_videos=tensors["pixel_values_videos"], video_grid_thw=tensors["video_grid_thw"])
    logits = _forward(model, tensors["input_ids"], **inputs)
    return F.cross_entropy(logits, tensors["labels"], ignore_index=IGNORE_INDEX, reduction="none")


@pytest.mark.parametrize("layout", [Layout.PACKED, Layout.PADDED])
def test_a_packed_micro_batch_gives_each_sample_its_own_loss(layout: Layout) -> None:
    model = tiny_qwen2_vl()
    samples = _samples()
    capacity = sum(s.length for s in samples) + 13
    batch = Batch.from_samples(step=0, rank=0, ranks=1, capacity=capacity, micro_batches=[samples], with_media=True)
    batch = decode_batch(*encode_batch(batch)[1:])
    (tensors,) = micro_batch_tensors(batch, layout, pad_token_id=PAD_TOKEN, attention_mask=False, pad_to_multiple_of=8)
    packed = _packed_losses(model, tensors)
    cu = tensors["cu_seqlens"].tolist()
    alone_total = torch.zeros((), dtype=torch.float64)
    for j, sample in enumerate(samples):
        alone = _alone_losses(model, sample)
        # The packed loss on the sample's tokens but its last (whose label is IGNORE_INDEX: the next sample's).
        torch.testing.assert_close(packed[cu[j] : cu[j + 1] - 1], alone, rtol=1e-9, atol=1e-12)
        alone_total += alone.sum()
    assert (packed[cu[len(samples)] :] == 0).all()  # padding: ignored
    torch.testing.assert_close(packed.sum(), alone_total, rtol=1e-12, atol=1e-12)


def test_the_comparison_tells_a_wrong_layout() -> None:
    """The same comparison fails for inputs a model would misread: without the text positions (so attention
    crosses samples), or with each image's patches in plain row-major order (no merge windows)."""
    model = tiny_qwen2_vl()
    samples = _samples()[:2]
    batch = Batch.from_samples(step=0, rank=0, ranks=1, capacity=999, micro_batches=[samples], with_media=True)
    (tensors,) = micro_batch_tensors(batch)
    right = _packed_losses(model, tensors)
    crossing = dict(tensors, position_ids=torch.arange(tensors["input_ids"].numel(), dtype=torch.int32))
    assert not torch.allclose(_packed_losses(model, crossing), right, rtol=1e-6)
    row_major = []
    for t, h, w in tensors["image_grid_thw"].tolist():
        merged = torch.arange(t * h * w).reshape(t, h // MERGE, w // MERGE, MERGE, MERGE)
        row_major.append(merged.permute(0, 1, 3, 2, 4).reshape(-1))  # patch order (t, h, w) -> merge-window slot
    offsets = np.cumsum([0] + [len(o) for o in row_major[:-1]])
    order = torch.cat([o + int(a) for o, a in zip(row_major, offsets, strict=True)])
    shuffled = dict(tensors, pixel_values=tensors["pixel_values"][order])
    assert not torch.allclose(_packed_losses(model, shuffled), right, rtol=1e-6)
