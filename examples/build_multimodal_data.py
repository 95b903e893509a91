"""Build the multimodal example's data: images and clips rendered here, captioned with what they show.

    python examples/build_multimodal_data.py --out examples/data

It first builds the text example's data (``build_example_data.py``), then, under ``--out``:

- ``captions/``: WebDataset tar shards of image-text pairs (``<key>.png`` or ``.jpg`` and ``<key>.txt``):
  stdlib docstring lines rendered into images of many sizes (an OCR task: the caption is the rendered
  text), charts matplotlib draws of functions named in their caption, and crops of the sample photos
  matplotlib ships;
- ``interleaved/``: JSONL documents whose ``segments`` interleave text with images under
  ``interleaved/images/`` (a module's docstring, a rendering of its first lines of code, a chart);
- ``clips/``: JSONL rows pairing a short MP4 under ``clips/videos/`` (a shape crossing the frame,
  encoded with PyAV's bundled FFmpeg) with a caption saying which shape, colour and direction;
- ``mm-tokenizer.json``: the example's tokenizer plus ``<|vision_start|>``, ``<|vision_end|>``,
  ``<|image_pad|>`` and ``<|video_pad|>`` as the ids after its vocabulary (8192..8195 by default).

Nothing is downloaded. For one interpreter and package set the build is deterministic; each output is
stamped with a hash of its inputs and skipped when current.
"""

from __future__ import annotations

import argparse
import io
import json
import random
import sys
import tarfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import build_example_data as text_data  # examples/ is not a package: its folder goes on sys.path

BUILD_VERSION = 1
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
PAIRS_PER_SHARD = 200
ROWS_PER_JSONL = 100
SHAPES = ("square", "circle", "triangle")
COLOURS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 220), "orange": (240, 150, 20)}
DIRECTIONS = ("left to right", "right to left", "top to bottom", "bottom to top")
FUNCTIONS = {
    "sin(x)": np.sin,
    "cos(x)": np.cos,
    "x squared": np.square,
    "the absolute value of x": np.abs,
    "e to the x": np.exp,
    "tanh(x)": np.tanh,
    "a square wave": lambda x: np.sign(np.sin(x)),
    "x cubed": lambda x: x**3,
}


def _font(size: int):
    from PIL import ImageFont

    return ImageFont.load_default(size=size)


def render_text(text: str, rng: random.Random) -> bytes:
    """``text`` drawn in black on a light background, wrapped to a random width, as PNG bytes."""
    from PIL import Image, ImageDraw

    size = rng.choice((12, 14, 16, 20, 24))
    lines = textwrap.wrap(text, width=rng.choice((24, 32, 48, 64))) or [text]
    font = _font(size)
    width = max(int(font.getlength(line)) for line in lines) + 2 * size
    height = (size + 4) * len(lines) + 2 * size
    shade = rng.randint(225, 255)
    image = Image.new("RGB", (max(width, 32), max(height, 32)), (shade, shade, rng.randint(215, 255)))
    draw = ImageDraw.Draw(image)
    for k, line in enumerate(lines):
        draw.text((size, size + k * (size + 4)), line, fill=(0, 0, 0), font=font)
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def render_chart(name: str, rng: random.Random) -> bytes:
    """A line chart of ``FUNCTIONS[name]`` with its name as the title, as PNG bytes."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    x = np.linspace(-3, 3, 200)
    figure, axes = plt.subplots(figsize=(rng.choice((2.0, 3.0, 4.0)), rng.choice((1.5, 2.0, 3.0))), dpi=64)
    axes.plot(x, FUNCTIONS[name](x), color=rng.choice(("C0", "C1", "C2", "C3")))
    axes.set_title(name, fontsize=9)
    out = io.BytesIO()
    figure.savefig(out, format="png")
    plt.close(figure)
    return out.getvalue()


def photo_crops(rng: random.Random, count: int) -> Iterator[tuple[bytes, str]]:
    """Random crops of the photos matplotlib ships, as JPEG bytes with a caption."""
    import matplotlib
    from PIL import Image

    folder = Path(matplotlib.get_data_path()) / "sample_data"
    photos = {
        "grace_hopper.jpg": "a photo of Grace Hopper in uniform",
        "Minduka_Present_Blue_Pack.png": "a picture of a blue backpack",
        "logo2.png": "the matplotlib logo",
    }
    opened = {name: Image.open(folder / name).convert("RGB") for name in photos}
    for _ in range(count):
        name = rng.choice(sorted(photos))
        image = opened[name]
        w, h = image.size
        cw, ch = rng.randint(w // 3, w), rng.randint(h // 3, h)
        x, y = rng.randint(0, w - cw), rng.randint(0, h - ch)
        scale = rng.choice((0.25, 0.5, 0.75, 1.0))
        crop = image.crop((x, y, x + cw, y + ch)).resize((max(16, int(cw * scale)), max(16, int(ch * scale))))
        out = io.BytesIO()
        crop.save(out, format="JPEG", quality=90)
        yield out.getvalue(), f"{photos[name]}, part of it at {int(scale * 100)} percent size"


def caption_pairs(lines: list[str], count: int, seed: int) -> Iterator[tuple[str, bytes, str]]:
    """``(extension, image bytes, caption)``: rendered docstring lines, charts and photo crops, mixed."""
    rng = random.Random(seed)
    crops = photo_crops(rng, count)
    for k in range(count):
        kind = k % 5
        if kind < 3:
            line = lines[rng.randrange(len(lines))]
            yield "png", render_text(line, rng), line
        elif kind == 3:
            name = rng.choice(sorted(FUNCTIONS))
            yield "png", render_chart(name, rng), f"a line chart of {name}"
        else:
            data, caption = next(crops)
            yield "jpg", data, caption


def write_captions(lines: list[str], count: int, folder: Path) -> None:
    pairs = list(caption_pairs(lines, count, seed=1))
    for shard in range(0, len(pairs), PAIRS_PER_SHARD):
        with tarfile.open(
            folder / f"captions-{shard // PAIRS_PER_SHARD:06d}.tar", "w", format=tarfile.USTAR_FORMAT
        ) as tar:
            for k, (extension, data, caption) in enumerate(pairs[shard : shard + PAIRS_PER_SHARD], start=shard):
                for name, payload in ((f"{k:06d}.{extension}", data), (f"{k:06d}.txt", caption.encode())):
                    info = tarfile.TarInfo(name)
                    info.size, info.mtime = len(payload), 0
                    tar.addfile(info, io.BytesIO(payload))


def write_interleaved(modules: list[text_data.Module], records: list[dict[str, str]], count: int, folder: Path) -> None:
    """Documents of a module: its docstring, an image of its first lines of code, what the code says, a chart."""
    rng = random.Random(2)
    images = folder / "images"
    images.mkdir()
    by_path: dict[str, str] = {}
    for record in records:
        by_path.setdefault(record["path"], record["text"])
    chosen = [m for m in modules if m[0] in by_path][:count]
    rows = []
    for k, (path, source) in enumerate(chosen):
        code = "\n".join(source.splitlines()[:6])[:300]
        (images / f"{k:05d}-code.png").write_bytes(render_text(code.replace("\n", " / "), rng))
        segments: list[dict[str, str]] = [
            {"text": f"{path}: {by_path[path][:400]}\nIts first lines:"},
            {"image": f"images/{k:05d}-code.png"},
        ]
        if k % 2 == 0:
            name = rng.choice(sorted(FUNCTIONS))
            (images / f"{k:05d}-chart.png").write_bytes(render_chart(name, rng))
            segments += [{"text": f"And a chart of {name}:"}, {"image": f"images/{k:05d}-chart.png"}]
        rows.append({"segments": segments})
    _write_jsonl(rows, folder, "interleaved")


def render_clip(path: Path, rng: random.Random) -> str:
    """A shape crossing the frame, written to ``path`` as MP4 (mpeg4); returns its caption."""
    import av
    from PIL import Image, ImageDraw

    shape, colour, direction = rng.choice(SHAPES), rng.choice(sorted(COLOURS)), rng.choice(DIRECTIONS)
    width, height = rng.choice(((128, 96), (160, 120), (96, 96), (192, 112)))
    fps, seconds = 8, rng.choice((1.0, 1.5, 2.0, 3.0))
    frames = int(fps * seconds)
    size = min(width, height) // 4
    with av.open(str(path), "w", format="mp4") as container:
        stream = container.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for f in range(frames):
            t = f / max(frames - 1, 1)
            x = {"left to right": t, "right to left": 1 - t}.get(direction, 0.5) * (width - size)
            y = {"top to bottom": t, "bottom to top": 1 - t}.get(direction, 0.5) * (height - size)
            image = Image.new("RGB", (width, height), (245, 245, 235))
            draw, box = ImageDraw.Draw(image), (x, y, x + size, y + size)
            if shape == "square":
                draw.rectangle(box, fill=COLOURS[colour])
            elif shape == "circle":
                draw.ellipse(box, fill=COLOURS[colour])
            else:
                draw.polygon([(x + size / 2, y), (x, y + size), (x + size, y + size)], fill=COLOURS[colour])
            for packet in stream.encode(av.VideoFrame.from_image(image)):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return f"a {colour} {shape} moves from {direction}"


def write_clips(count: int, folder: Path) -> None:
    rng = random.Random(3)
    videos = folder / "videos"
    videos.mkdir()
    rows = []
    for k in range(count):
        caption = render_clip(videos / f"{k:05d}.mp4", rng)
        rows.append({"video": f"videos/{k:05d}.mp4", "text": caption})
    _write_jsonl(rows, folder, "clips")


def _write_jsonl(rows: list[dict], folder: Path, stem: str) -> None:
    for start in range(0, len(rows), ROWS_PER_JSONL):
        with open(folder / f"{stem}-{start // ROWS_PER_JSONL:04d}.jsonl", "w", encoding="utf-8") as file:
            for row in rows[start : start + ROWS_PER_JSONL]:
                file.write(json.dumps(row) + "\n")


def write_tokenizer(base: Path, target: Path) -> None:
    from tokenizers import AddedToken, Tokenizer

    tokenizer = Tokenizer.from_file(str(base))
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    tokenizer.add_special_tokens([AddedToken(t, special=True) for t in VISION_TOKENS])
    ids = [tokenizer.token_to_id(t) for t in VISION_TOKENS]
    if ids != list(range(vocab, vocab + len(VISION_TOKENS))):
        raise SystemExit(f"vision tokens got ids {ids}, expected {vocab}..{vocab + 3}")
    tokenizer.save(str(target))


def build(out: Path, *, pairs: int, documents: int, clips: int, limit: int | None = None) -> dict[str, bool]:
    """Build the text example's data, then every multimodal output under ``out``."""
    built = text_data.build(out, limit=limit)
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    files = text_data.stdlib_files(root, limit)
    modules = text_data.read_modules(root, files)
    records = list(text_data.docstrings(modules))
    lines = sorted({r["text"].strip().splitlines()[0][:120] for r in records if r["text"].strip()})
    base = (BUILD_VERSION, sys.version, limit)
    text_hash = text_data.fingerprint(*base, lines[:50], len(lines), len(modules))
    tokenizer_stamp = json.loads((out / ".tokenizer.json.stamp").read_text())["hash"]
    built |= {
        "captions": text_data.build_once(
            out, "captions", text_data.fingerprint(text_hash, pairs), lambda d: write_captions(lines, pairs, d)
        ),
        "interleaved": text_data.build_once(
            out,
            "interleaved",
            text_data.fingerprint(text_hash, documents),
            lambda d: write_interleaved(modules, records, documents, d),
        ),
        "clips": text_data.build_once(
            out, "clips", text_data.fingerprint(*base, clips), lambda d: write_clips(clips, d)
        ),
        "mm-tokenizer.json": text_data.build_once(
            out,
            "mm-tokenizer.json",
            text_data.fingerprint(tokenizer_stamp, VISION_TOKENS),
            lambda d: write_tokenizer(out / "tokenizer.json", d / "mm-tokenizer.json"),
        ),
    }
    return built


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "data", help="output folder")
    parser.add_argument("--pairs", type=int, default=1500, help="image-text pairs in captions/")
    parser.add_argument("--documents", type=int, default=400, help="interleaved documents")
    parser.add_argument("--clips", type=int, default=240, help="video clips")
    parser.add_argument("--limit", type=int, default=None, help="use only this many stdlib modules (a smaller build)")
    args = parser.parse_args(argv)
    for name in ("pairs", "documents", "clips"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    began = time.perf_counter()
    built = build(args.out, pairs=args.pairs, documents=args.documents, clips=args.clips, limit=args.limit)
    for name, fresh in built.items():
        print(f"{name:18} {'built' if fresh else 'up to date'}")
    print(f"done in {time.perf_counter() - began:.1f} s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
