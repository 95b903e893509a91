"""The loader's media path: images/s through ``SampleBuilder`` and video frames/s through ``MediaDecoder``, each
next to a plain loop doing the same decode and resize, and what each pixel encoding costs on the topic, in the
loader and in the trainer.

    .venv/bin/python -m benchmarks.media_loader_bench [--repeats 5] [--quick] [--markdown]

Inputs, made in a temporary folder at start (nothing is downloaded):

- **images**: the photographs and drawings matplotlib ships (``mpl-data/sample_data``: grace_hopper.jpg,
  logo2.png, Minduka_Present_Blue_Pack.png), text pages Pillow renders (PNG, 640x480 to 1654x2339), and
  rendered scenes (gradients, shapes, text and noise; JPEG q95, 800x600 to 2048x1536): three classes, since
  how well pixels compress depends on what they show.
- **clips**: frames Pillow renders (moving shapes and a frame counter), encoded by PyAV with the encoders
  this wheel has (``av.codecs_available``): H.264 in MP4, MPEG-4 part 2 in MP4, VP9 in WebM.

Sections, each arm run ``--repeats`` times alternating which goes first, medians reported:

(a) **images/s per process**: ``SampleBuilder.build`` over one document per image (a caption and the image as
    a path under the root; Qwen2-VL's defaults; ``raw`` pixels) against a plain loop over the same files:
    ``Image.open``, ``convert("RGB")``, ``resize`` to the same smart size with BICUBIC, ``np.asarray``. The
    ratio (target >= 0.8) is plain seconds / builder seconds, on CPU time (this process's, so other work on
    a shared machine does not count) and on wall time.
(b) **video frames/s**: ``MediaDecoder.decode`` per clip (demux, decode, sample, resize, pad, raw pixels)
    against a plain PyAV loop given the same sampling times beforehand: ``container.decode``, every frame
    decoded, the frame on screen at each sampling time converted with ``frame.reformat`` (rgb24, the smart
    size, BICUBIC) and ``to_ndarray``. Frames/s counts the clip's frames (all are decoded).
(c) **pixel encodings** (raw, jpeg at q90, png): per image class, bytes per image on the topic (the encoded
    sample's value: ``topics.formats.sample_codec.encode_sample`` when it carries media, else the text record plus
    the frames and their length prefixes, marked "estimated"), the loader's CPU per image (the whole build),
    the trainer's CPU per image to get the pixels back (``topics.formats.media_pixels.frames_array``), and the
    PSNR of the pixels the trainer gets against raw.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import av
import matplotlib
import numpy as np
from PIL import Image, ImageDraw

from benchmarks._table import add_markdown_flag, print_table
from connectors.media.config import VisionConfig
from connectors.media.decode import MediaDecoder
from connectors.media.frame_sampling import clip_span, sample_times
from connectors.media.resize import smart_resize
from connectors.readers.base import Document, MediaRef
from connectors.samples import SampleBuilder
from connectors.tokenizer import TextTokenizer
from topics.formats import sample_codec
from topics.formats.media_pixels import frames_array
from topics.formats.sample import Sample

VISION = VisionConfig(image_token_id=1000, video_token_id=1001, vision_start_id=1002, vision_end_id=1003)
CAPTIONS = ["A photograph.", "A page of rendered text with a heading.", "Shapes over a gradient, with noise."]
TEXT_PAGES = [(640, 480), (1024, 768), (1280, 720), (1654, 2339)]
SCENES = [(800, 600), (1280, 960), (1920, 1080), (2048, 1536)]
# (name, container format, encoder, width, height, frames per second, seconds)
CLIPS = [
    ("h264-640x360", "mp4", "libx264", 640, 360, 24, 8),
    ("mpeg4-1280x720", "mp4", "mpeg4", 1280, 720, 30, 4),
    ("vp9-480x270", "webm", "libvpx-vp9", 480, 270, 25, 6),
]


@dataclass(frozen=True)
class Corpus:
    root: Path
    images: dict[str, list[str]]  # image class -> paths under root
    clips: list[tuple[str, str, int]]  # (name, path under root, frames)


def make_corpus(root: Path, quick: bool) -> Corpus:
    (root / "img").mkdir(parents=True)
    (root / "clips").mkdir()
    shipped = Path(matplotlib.get_data_path()) / "sample_data"
    images: dict[str, list[str]] = {"shipped": [], "text pages": [], "scenes": []}
    for name in ("grace_hopper.jpg", "logo2.png", "Minduka_Present_Blue_Pack.png"):
        shutil.copy(shipped / name, root / "img" / name)
        images["shipped"].append(f"img/{name}")
    rng = np.random.default_rng(0)
    for k, (width, height) in enumerate(TEXT_PAGES[:2] if quick else TEXT_PAGES):
        path = f"img/page{k}.png"
        text_page(width, height, k).save(root / path, format="PNG")
        images["text pages"].append(path)
    for k, (width, height) in enumerate(SCENES[:2] if quick else SCENES):
        path = f"img/scene{k}.jpg"
        scene(width, height, rng).save(root / path, format="JPEG", quality=95)
        images["scenes"].append(path)
    clips = []
    for name, fmt, codec, width, height, rate, seconds in CLIPS:
        if codec not in av.codecs_available:
            print(f"skipping the {name} clip: this PyAV wheel has no {codec} encoder")
            continue
        frames = rate * (seconds // 2 if quick else seconds)
        path = f"clips/{name}.{'webm' if fmt == 'webm' else 'mp4'}"
        encode_clip(root / path, fmt, codec, width, height, rate, frames, rng)
        clips.append((name, path, frames))
    return Corpus(root, images, clips)


def text_page(width: int, height: int, seed: int) -> Image.Image:
    image = Image.new("RGB", (width, height), (250, 250, 245))
    draw = ImageDraw.Draw(image)
    draw.rectangle((20, 20, width - 20, 60), fill=(30, 60, 120))
    words = ["mixflow", "streams", "samples", "from", "many", "sources", "into", "balanced", "steps", "for", "each"]
    for line, y in enumerate(range(80, height - 20, 14)):
        text = " ".join(words[(line + seed + i) % len(words)] for i in range(max(1, width // 60)))
        draw.text((24, y), text, fill=(20, 20, 20))
    return image


def scene(width: int, height: int, rng: np.random.Generator) -> Image.Image:
    ys, xs = np.mgrid[0:height, 0:width]
    base = np.stack([xs * 255 // width, ys * 255 // height, (xs + ys) * 127 // (width + height) + 64], -1)
    image = Image.fromarray(base.astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(image)
    for _ in range(40):
        x, y = int(rng.integers(0, width)), int(rng.integers(0, height))
        size = int(rng.integers(20, max(21, width // 5)))
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)((x, y, x + size, y + size), fill=colour)
    draw.text((10, 10), f"scene {width}x{height}", fill=(255, 255, 255))
    noisy = np.asarray(image).astype(np.int16) + rng.normal(0, 6, (height, width, 3)).astype(np.int16)
    return Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8), "RGB")


def encode_clip(
    path: Path, fmt: str, codec: str, width: int, height: int, rate: int, frames: int, rng: np.random.Generator
) -> None:
    background = np.asarray(scene(width, height, rng))
    with av.open(str(path), "w", format=fmt) as container:
        stream = container.add_stream(codec, rate=rate)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for k in range(frames):
            image = Image.fromarray(np.roll(background, 4 * k, axis=1), "RGB")
            ImageDraw.Draw(image).text((10, height - 20), f"frame {k}", fill=(255, 255, 0))
            container.mux(stream.encode(av.VideoFrame.from_ndarray(np.asarray(image), format="rgb24")))
        container.mux(stream.encode())


def caption_tokenizer() -> TextTokenizer:
    from tokenizers import ByteLevelBPETokenizer

    trainer = ByteLevelBPETokenizer()
    trainer.train_from_iterator(CAPTIONS * 20, vocab_size=400, show_progress=False)
    return TextTokenizer(trainer._tokenizer)


def image_documents(paths: list[str]) -> list[Document]:
    return [
        Document("images", "captions.jsonl", row, parts=(CAPTIONS[row % len(CAPTIONS)], MediaRef("image", p, path=p)))
        for row, p in enumerate(paths)
    ]


@dataclass(frozen=True)
class Timing:
    cpu: float
    wall: float


def timed(work: Callable[[], object]) -> tuple[Timing, object]:
    cpu, wall = time.process_time(), time.perf_counter()
    out = work()
    return Timing(time.process_time() - cpu, time.perf_counter() - wall), out


def alternate(arms: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[Timing]]:
    """Each arm ``repeats`` times after one warm-up run each, the first arm alternating."""
    for work in arms.values():
        work()
    runs: dict[str, list[Timing]] = {name: [] for name in arms}
    names = list(arms)
    for repeat in range(repeats):
        for name in names if repeat % 2 == 0 else names[::-1]:
            runs[name].append(timed(arms[name])[0])
    return runs


def med(runs: list[Timing], field: str) -> float:
    return statistics.median(getattr(run, field) for run in runs)


# (a) images/s


def plain_image_loop(root: Path, paths: list[str]) -> list[np.ndarray]:
    out = []
    for path in paths:
        with Image.open(root / path) as image:
            rgb = image.convert("RGB")
            height, width = smart_resize(
                rgb.height, rgb.width, factor=VISION.factor, min_pixels=VISION.min_pixels, max_pixels=VISION.max_pixels
            )
            out.append(np.asarray(rgb.resize((width, height), Image.Resampling.BICUBIC)))
    return out


def bench_images(corpus: Corpus, tokenizer: TextTokenizer, repeats: int) -> list[list[object]]:
    paths = [p for group in corpus.images.values() for p in group]
    documents = image_documents(paths)
    builder = SampleBuilder(tokenizer, max_length=8192, eod_id=0, vision=VISION, media_root=corpus.root)
    built = builder.build(documents)
    if built.dead_letters or len(built.samples) != len(paths):
        raise SystemExit(f"the builder refused images: {built.dead_letters}")
    runs = alternate(
        {"builder": lambda: builder.build(documents), "plain": lambda: plain_image_loop(corpus.root, paths)}, repeats
    )
    n = len(paths)
    rows = []
    for name in ("builder", "plain"):
        rows.append([name, n, f"{n / med(runs[name], 'cpu'):.1f}", f"{n / med(runs[name], 'wall'):.1f}", "", ""])
    rows[0][4] = f"{med(runs['plain'], 'cpu') / med(runs['builder'], 'cpu'):.2f}"
    rows[0][5] = f"{med(runs['plain'], 'wall') / med(runs['builder'], 'wall'):.2f}"
    return rows


# (b) video frames/s


def sampling_targets(path: Path) -> list[float]:
    """The times the decoder samples the clip at, found before the plain loop's clock starts."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        times = [float(p.pts * stream.time_base) for p in container.demux(stream) if p.size]
    start, duration = clip_span(np.array(times))
    return sample_times(
        start,
        duration,
        fps=VISION.video_fps,
        max_frames=VISION.video_max_frames,
        temporal_patch_size=VISION.temporal_patch_size,
    ).tolist()


def plain_video_loop(path: Path, sampling: list[float]) -> list[np.ndarray]:
    targets = list(sampling)
    out: list[np.ndarray] = []
    size = None
    with av.open(str(path)) as container:
        for frame in container.decode(video=0):
            if size is None:
                size = smart_resize(
                    frame.height,
                    frame.width,
                    factor=VISION.factor,
                    min_pixels=VISION.min_pixels,
                    max_pixels=VISION.max_pixels,
                )
            while targets and frame.time >= targets[0] - 1e-6:
                targets.pop(0)
                resized = frame.reformat(width=size[1], height=size[0], format="rgb24", interpolation="BICUBIC")
                out.append(resized.to_ndarray())
    return out


def bench_clips(corpus: Corpus, repeats: int) -> list[list[object]]:
    decoder = MediaDecoder(VISION, corpus.root)
    rows = []
    for name, path, frames in corpus.clips:
        ref = MediaRef("video", path, path=path)
        item = decoder.decode(ref)
        targets = sampling_targets(corpus.root / path)
        arms = {
            "decoder": lambda r=ref: decoder.decode(r),
            "plain": lambda p=corpus.root / path, t=targets: plain_video_loop(p, t),
        }
        runs = alternate(arms, repeats)
        decoder_fps = frames / med(runs["decoder"], "cpu")
        plain_fps = frames / med(runs["plain"], "cpu")
        rows.append(
            [
                name,
                frames,
                f"{item.grid_t * item.temporal_patch_size} of {item.height}x{item.width}",
                f"{decoder_fps:.0f}",
                f"{plain_fps:.0f}",
                f"{med(runs['plain'], 'cpu') / med(runs['decoder'], 'cpu'):.2f}",
                f"{med(runs['plain'], 'wall') / med(runs['decoder'], 'wall'):.2f}",
            ]
        )
    return rows


# (c) pixel encodings


def topic_bytes(sample: Sample) -> tuple[int, bool]:
    """The encoded sample's size, and whether the codec carried the media (else an estimate)."""
    value, _ = sample_codec.encode_sample(sample)
    if hasattr(sample_codec, "MEDIA_SAMPLE_SCHEMA") or not sample.media:
        return len(value), True
    # Avro: each frame is a length-prefixed byte string (a varint of at most 5 bytes); ten ints, two strings.
    frames = sum(len(f) + 5 for item in sample.media for f in item.frames)
    return len(value) + frames + 40 * len(sample.media), False


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255**2 / mse)


def bench_encodings(corpus: Corpus, tokenizer: TextTokenizer, repeats: int) -> tuple[list[list[object]], bool]:
    rows = []
    exact = True
    for group, paths in corpus.images.items():
        documents = image_documents(paths)
        reference: list[np.ndarray] = []
        for encoding in ("raw", "jpeg", "png"):
            vision = replace(VISION, encoding=encoding, jpeg_quality=90)
            builder = SampleBuilder(tokenizer, max_length=8192, eod_id=0, vision=vision, media_root=corpus.root)
            samples = builder.build(documents).samples
            items = [item for s in samples for item in s.media]
            loader = alternate({"build": lambda b=builder, d=documents: b.build(d)}, repeats)["build"]
            trainer = alternate({"pixels": lambda i=items: [frames_array(item) for item in i]}, repeats)["pixels"]
            sizes = [topic_bytes(s) for s in samples]
            exact = exact and all(ok for _, ok in sizes)
            pixels = [frames_array(item) for item in items]
            reference = reference or pixels
            quality = min(psnr(a, b) for a, b in zip(reference, pixels, strict=True))
            n = len(paths)
            rows.append(
                [
                    group,
                    encoding,
                    n,
                    f"{statistics.mean(item.height * item.width for item in items) / 1e3:.0f}k",
                    f"{statistics.mean(size for size, _ in sizes) / 1e3:.1f}",
                    f"{med(loader, 'cpu') / n * 1e3:.2f}",
                    f"{med(trainer, 'cpu') / n * 1e3:.2f}",
                    "lossless" if math.isinf(quality) else f"{quality:.1f}",
                ]
            )
    return rows, exact


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="fewer and shorter inputs, 3 repeats")
    add_markdown_flag(parser)
    args = parser.parse_args()
    if args.quick:
        args.repeats = 3
    with tempfile.TemporaryDirectory(prefix="media-bench-") as folder:
        corpus = make_corpus(Path(folder), args.quick)
        tokenizer = caption_tokenizer()
        print(
            f"{platform.machine()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}; Pillow "
            f"{Image.__version__}, PyAV {av.__version__}; medians of {args.repeats} runs; Qwen2-VL's defaults "
            f"(patch 14, merge 2, {VISION.min_pixels}..{VISION.max_pixels} pixels, {VISION.video_fps} fps, at most "
            f"{VISION.video_max_frames} frames)"
        )
        print_table(
            ["arm", "images", "images/s (CPU)", "images/s (wall)", "ratio (CPU)", "ratio (wall)"],
            bench_images(corpus, tokenizer, args.repeats),
            title="(a) images through SampleBuilder (raw pixels) against a plain Pillow decode+resize loop",
            markdown=args.markdown,
        )
        print_table(
            ["clip", "frames", "sampled", "decoder frames/s", "plain frames/s", "ratio (CPU)", "ratio (wall)"],
            bench_clips(corpus, args.repeats),
            title="(b) clips through MediaDecoder against a plain PyAV decode+reformat loop (frames/s on CPU time)",
            markdown=args.markdown,
        )
        rows, exact = bench_encodings(corpus, tokenizer, args.repeats)
        print_table(
            [
                "images",
                "encoding",
                "n",
                "pixels",
                "KB/image on topic",
                "loader ms/image",
                "trainer ms/image",
                "PSNR dB",
            ],
            rows,
            title="(c) pixel encodings: the encoded sample, the loader's whole build and the trainer's frames_array"
            + ("" if exact else " (topic bytes estimated: this tree's sample codec does not carry media)"),
            markdown=args.markdown,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
