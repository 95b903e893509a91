"""The sink's CPU per image to turn a decoded batch into Qwen2-VL's ``pixel_values``, raw vs JPEG frames, against a
plain loop over the same resized images through transformers' Qwen2-VL image processor.

    .venv/bin/python -m benchmarks.sink_media_bench [--repeats 7] [--images 8] [--quick] [--markdown]

Images: matplotlib's sample photograph (``grace_hopper.jpg``) resized with Pillow's BICUBIC to the Qwen2-VL smart
size (patch 14, merge 2, min_pixels 3136, max_pixels 1003520) of a few source sizes, as a loader would send them.
Per size, one batch of ``--images`` samples of one image each is encoded with ``encode_batch`` and decoded with
``decode_batch`` (what the sink's reader holds), with raw frames and with JPEG frames (quality 90).

Arms, each timed as CPU seconds of the process (``time.process_time``) per image, median over the repeats:

- **sink**: ``trainer_sink.vlm.qwen2_vl.pack_media(batch)``: the frames decoded (JPEG) or viewed in place (raw),
  normalized and laid out as Qwen2-VL's patches, every micro-batch's ``pixel_values`` and grids.
- **transformers**: ``Qwen2VLImageProcessorPil(images, do_resize=False)`` over the same images (the numpy
  backend; its torchvision backend needs torchvision), from uint8 arrays for raw and from the JPEG bytes
  decoded with Pillow for JPEG; the same pixel values, bit for bit (checked).

Timings are printed, never asserted.
"""

from __future__ import annotations

import argparse
import io
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import matplotlib
import numpy as np
from PIL import Image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil, smart_resize

from benchmarks._table import add_markdown_flag, print_table
from topics.formats.batch import Batch
from topics.formats.batch_codec import decode_batch, encode_batch
from topics.formats.media import MediaItem
from topics.formats.media_pixels import encode_frames
from topics.formats.sample import Sample
from trainer_sink.vlm.qwen2_vl import pack_media

PATCH, MERGE, TEMPORAL = 14, 2, 2
MIN_PIXELS, MAX_PIXELS = 56 * 56, 28 * 28 * 1280
SOURCE_SIZES = [(256, 256), (480, 640), (768, 1024), (1080, 1920)]
"""(height, width) of the source images before the smart resize."""
IMAGE_TOKEN = 290


def resized_image(height: int, width: int) -> np.ndarray:
    photo = Image.open(Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg").convert("RGB")
    source = photo.resize((width, height), Image.Resampling.BICUBIC)
    h, w = smart_resize(height, width, factor=PATCH * MERGE, min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    return np.asarray(source.resize((w, h), Image.Resampling.BICUBIC))


def image_batch(image: np.ndarray, images: int, encoding: str) -> Batch:
    height, width, _ = image.shape
    frames = encode_frames(image[None], encoding)  # type: ignore[arg-type]
    samples = []
    for i in range(images):
        item = MediaItem(
            "image", 1, height // PATCH, width // PATCH, MERGE, TEMPORAL, height, width, 1, encoding, frames
        )
        tokens = np.full(item.tokens + 2, IMAGE_TOKEN, np.int32)
        tokens[0] = tokens[-1] = 7
        samples.append(Sample(f"vl/{i}", "vl", tokens, media=(item,)))
    capacity = sum(s.length for s in samples)
    batch = Batch.from_samples(step=0, rank=0, ranks=1, capacity=capacity, micro_batches=[samples], with_media=True)
    return decode_batch(*encode_batch(batch)[1:])


def cpu_seconds(run: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        began = time.process_time()
        run()
        times.append(time.process_time() - began)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--images", type=int, default=8, help="images per batch")
    parser.add_argument("--quick", action="store_true", help="2 sizes, 3 repeats")
    add_markdown_flag(parser)
    args = parser.parse_args()
    sizes = SOURCE_SIZES[:2] if args.quick else SOURCE_SIZES
    repeats = 3 if args.quick else args.repeats
    processor = Qwen2VLImageProcessorPil(patch_size=PATCH, merge_size=MERGE, temporal_patch_size=TEMPORAL)
    rows = []
    for source in sizes:
        image = resized_image(*source)
        height, width, _ = image.shape
        for encoding in ("raw", "jpeg"):
            batch = image_batch(image, args.images, encoding)
            (packed,) = pack_media(batch)
            jpegs = [bytes(batch.media.frames(k)[0]) for k in range(len(batch.media))]

            def reference(
                encoding: str = encoding, jpegs: list[bytes] = jpegs, image: np.ndarray = image
            ) -> np.ndarray:
                if encoding == "raw":
                    arrays = [image] * args.images
                else:
                    arrays = [np.asarray(Image.open(io.BytesIO(data)).convert("RGB")) for data in jpegs]
                return processor(arrays, do_resize=False, return_tensors="np")["pixel_values"]

            assert np.array_equal(reference(), packed.pixel_values), "the arms disagree"
            sink = cpu_seconds(lambda batch=batch: pack_media(batch), repeats) / args.images
            plain = cpu_seconds(reference, repeats) / args.images
            patches = (height // PATCH) * (width // PATCH)
            rows.append(
                [
                    f"{source[0]}x{source[1]} -> {height}x{width}",
                    f"{patches:,}",
                    encoding,
                    f"{sink * 1e3:.2f}",
                    f"{plain * 1e3:.2f}",
                    f"{plain / sink:.2f}",
                    f"{sink / patches * 1e6:.2f}",
                ]
            )
    print_table(
        ["image (source -> resized)", "patches", "frames", "sink ms/image", "transformers ms/image", "speed-up",
         "sink us/patch"],
        rows,
        title=f"CPU per image, batches of {args.images} images, median of {repeats}",
        markdown=args.markdown,
    )  # fmt: skip


if __name__ == "__main__":
    main()
