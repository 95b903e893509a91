"""Per micro-batch vision inputs against transformers' own Qwen2-VL code: pixel values bit for bit as its image
processor makes them, the encoder's cu_seqlens as its vision transformer builds them, and the 3-D positions
as ``get_rope_index`` computes them for each sample alone; in both layouts of the sink's tensors."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import Qwen2VLConfig
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel
from transformers.vision_utils import get_vision_cu_seqlens

from tests.sink_media_support import (
    IMAGE_TOKEN,
    MERGE,
    PATCH,
    TEMPORAL,
    VIDEO_TOKEN,
    VISION_END,
    VISION_START,
    VOCAB,
    media_batches,
    media_sample,
)
from topics.errors import MixflowError
from topics.formats.batch import Batch
from topics.formats.batch_codec import decode_batch, encode_batch
from topics.formats.media_pixels import frames_array
from topics.formats.packing import pack_micro_batches
from topics.formats.sample import Sample
from trainer_sink import Layout, micro_batch_tensors
from trainer_sink.vlm.qwen2_vl import (
    OPENAI_CLIP_MEAN,
    OPENAI_CLIP_STD,
    PixelOptions,
    PixelOptionsError,
    pack_media,
    patchify,
)


@functools.cache
def image_processor() -> Qwen2VLImageProcessorPil:
    return Qwen2VLImageProcessorPil(patch_size=PATCH, merge_size=MERGE, temporal_patch_size=TEMPORAL)


@functools.cache
def rope_model() -> Qwen2VLModel:
    """A Qwen2-VL model only for its ``get_rope_index`` (which reads the config, not the weights)."""
    config = Qwen2VLConfig(
        text_config={"vocab_size": VOCAB, "hidden_size": 16, "intermediate_size": 16, "num_hidden_layers": 1,
                     "num_attention_heads": 2, "num_key_value_heads": 1,
                     "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2]}},
        vision_config={"depth": 1, "embed_dim": 8, "hidden_size": 16, "num_heads": 2, "spatial_merge_size": MERGE,
                       "patch_size": PATCH, "temporal_patch_size": TEMPORAL},
        image_token_id=IMAGE_TOKEN,
        video_token_id=VIDEO_TOKEN,
        vision_start_token_id=VISION_START,
        vision_end_token_id=VISION_END,
    )  # fmt: skip
    return Qwen2VLModel(config)


def reference_video_patches(frames: np.ndarray) -> np.ndarray:
    """``Qwen2VLVideoProcessor.patchify`` of transformers 5.24 (its view and permute, copied: that module needs
    torchvision), over frames rescaled and normalized as the numpy image processor does."""
    scaled = (frames.astype(np.float64) * (1 / 255)).astype(np.float32)
    normalized = (scaled - np.asarray(OPENAI_CLIP_MEAN, np.float32)) / np.asarray(OPENAI_CLIP_STD, np.float32)
    videos = torch.from_numpy(normalized).permute(0, 3, 1, 2)[None]  # [batch, frames, channel, height, width]
    batch, frames_n, channel, height, width = videos.shape
    grid_t, grid_h, grid_w = frames_n // TEMPORAL, height // PATCH, width // PATCH
    patches = videos.reshape(
        batch, grid_t, TEMPORAL, channel, grid_h // MERGE, MERGE, PATCH, grid_w // MERGE, MERGE, PATCH
    ).permute(0, 1, 4, 7, 5, 8, 3, 2, 6, 9)
    return patches.reshape(grid_t * grid_h * grid_w, channel * TEMPORAL * PATCH * PATCH).numpy()


def _samples_by_micro_batch(batch: Batch) -> list[list[Sample]]:
    rows = batch.samples()
    return [[s for s, k in zip(rows, batch.micro_batch, strict=True) if k == m] for m in range(batch.micro_batches)]


@settings(deadline=None, max_examples=25)
@given(batch=media_batches(encodings=("raw", "png", "jpeg")))
def test_vision_inputs_are_what_transformers_makes(batch: Batch) -> None:
    batch = decode_batch(encode_batch(batch)[1])
    packed = pack_media(batch)
    assert len(packed) == batch.micro_batches
    for media, group in zip(packed, _samples_by_micro_batch(batch), strict=True):
        items = [item for sample in group for item in sample.media]
        images = [item for item in items if item.kind == "image"]
        videos = [item for item in items if item.kind == "video"]
        np.testing.assert_array_equal(media.image_grid_thw, np.array([it.grid for it in images]).reshape(-1, 3))
        np.testing.assert_array_equal(media.video_grid_thw, np.array([it.grid for it in videos]).reshape(-1, 3))
        assert media.image_grid_thw.dtype == media.video_grid_thw.dtype == np.int64
        for cu, grid in (
            (media.image_cu_seqlens, media.image_grid_thw),
            (media.video_cu_seqlens, media.video_grid_thw),
        ):
            np.testing.assert_array_equal(cu, get_vision_cu_seqlens(torch.from_numpy(grid)).numpy())
            assert cu.dtype == np.int32
        dim = 3 * TEMPORAL * PATCH * PATCH
        if images:
            expected = image_processor()([frames_array(it)[0] for it in images], do_resize=False, return_tensors="np")
            np.testing.assert_array_equal(media.pixel_values, expected["pixel_values"])
            np.testing.assert_array_equal(media.image_grid_thw, expected["image_grid_thw"])
        else:
            assert media.pixel_values.shape == (0, dim)
        expected_videos = [reference_video_patches(frames_array(it)) for it in videos]
        np.testing.assert_array_equal(
            media.pixel_values_videos, np.concatenate(expected_videos) if videos else np.zeros((0, dim), np.float32)
        )
        assert media.pixel_values.dtype == media.pixel_values_videos.dtype == np.float32


def _rope_index(sample: Sample) -> np.ndarray:
    ids = torch.from_numpy(sample.tokens.astype(np.int64))[None]
    types = (ids == IMAGE_TOKEN).int() + 2 * (ids == VIDEO_TOKEN).int()
    images = [it.grid for it in sample.media if it.kind == "image"]
    videos = [it.grid for it in sample.media if it.kind == "video"]
    positions, _ = rope_model().get_rope_index(
        ids,
        types,
        image_grid_thw=torch.tensor(images) if images else None,
        video_grid_thw=torch.tensor(videos) if videos else None,
    )
    return positions[:, 0].numpy()


@settings(deadline=None, max_examples=40)
@given(batch=media_batches())
def test_positions_and_token_types_are_each_sample_alone(batch: Batch) -> None:
    for media, packed, group in zip(
        pack_media(batch), pack_micro_batches(batch), _samples_by_micro_batch(batch), strict=True
    ):
        assert media.mrope_position_ids.shape == (3, packed.token_ids.size)
        assert media.mrope_position_ids.dtype == media.mm_token_type_ids.dtype == np.int32
        ids = packed.token_ids
        np.testing.assert_array_equal(media.mm_token_type_ids, (ids == IMAGE_TOKEN) + 2 * (ids == VIDEO_TOKEN))
        for j, sample in enumerate(group):
            lo, hi = packed.cu_seqlens[j], packed.cu_seqlens[j + 1]
            if sample.media:
                np.testing.assert_array_equal(media.mrope_position_ids[:, lo:hi], _rope_index(sample))
            else:  # get_rope_index wants a vision token; text is counted up on every row
                np.testing.assert_array_equal(media.mrope_position_ids[:, lo:hi], np.tile(np.arange(hi - lo), (3, 1)))


@settings(deadline=None, max_examples=25)
@given(batch=media_batches(), multiple=st.integers(1, 16))
def test_both_layouts_carry_the_vision_keys(batch: Batch, multiple: int) -> None:
    packed_layout = micro_batch_tensors(batch, pad_to_multiple_of=multiple)
    padded_layout = micro_batch_tensors(batch, Layout.PADDED)
    for media, packed, padded in zip(pack_media(batch), packed_layout, padded_layout, strict=True):
        n, total = media.mm_token_type_ids.size, packed["input_ids"].numel()
        for tensors in (packed, padded):
            assert torch.equal(tensors["pixel_values"], torch.from_numpy(media.pixel_values))
            assert torch.equal(tensors["video_grid_thw"], torch.from_numpy(media.video_grid_thw))
            assert torch.equal(tensors["mrope_position_ids"][:, :n], torch.from_numpy(media.mrope_position_ids))
            assert torch.equal(tensors["mm_token_type_ids"][:n], torch.from_numpy(media.mm_token_type_ids))
        assert packed["mrope_position_ids"].shape == (3, total)
        assert (packed["mrope_position_ids"][:, n:] == packed["position_ids"][n:]).all()
        assert padded["mrope_position_ids"].shape == (3, batch.capacity)
        assert (padded["mrope_position_ids"][:, n:] == 0).all() and (padded["mm_token_type_ids"][n:] == 0).all()


def test_a_text_batch_has_todays_keys() -> None:
    batch = Batch.from_samples(step=0, rank=0, ranks=1, capacity=8, micro_batches=[[Sample("a", "s", np.arange(3))]])
    (tensors,) = micro_batch_tensors(batch)
    assert set(tensors) == {
        *("input_ids", "labels", "position_ids", "cu_seqlens", "max_seqlen", "padding_tokens"),
        *("step", "micro_batch", "micro_batches", "rank", "sample_ids"),
    }


def test_normalization_and_patch_sizes_are_options() -> None:
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (1, 56, 28, 3), dtype=np.uint8)
    options = PixelOptions(image_mean=(0.5, 0.5, 0.5), image_std=(0.5, 0.25, 1.0))
    patches = patchify(frames, MERGE, options)
    expected = patchify(frames, MERGE, PixelOptions(image_mean=(0.0,) * 3, image_std=(1.0,) * 3))
    std = np.repeat(np.array([0.5, 0.25, 1.0], np.float32), TEMPORAL * PATCH * PATCH)
    np.testing.assert_allclose(patches, (expected - 0.5) / std, rtol=1e-6)
    sample = media_sample(rng, "vl/0", [("image", (1, 2, 2))])
    batch = Batch.from_samples(step=0, rank=0, ranks=1, capacity=99, micro_batches=[[sample]], with_media=True)
    wrong = r"media items have patch_size 14 .*PixelOptions say 16: give PixelOptions\(patch_size=14\)"
    with pytest.raises(PixelOptionsError, match=wrong) as raised:
        pack_media(batch, PixelOptions(patch_size=16))
    assert isinstance(raised.value, MixflowError) and "\n" not in str(raised.value)  # one line, as the CLI prints
    with pytest.raises(PixelOptionsError, match=r"temporal_patch_size 2 .*say 3"):
        pack_media(batch, PixelOptions(temporal_patch_size=3))
    with pytest.raises(ValueError, match="image_mean and image_std"):
        PixelOptions(image_std=(1.0, 0.0, 1.0))
