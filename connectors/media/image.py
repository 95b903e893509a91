"""Images with Pillow: refuse what is too big or broken, convert to RGB, resize to the smart size, patch grid."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from connectors.media.config import VisionConfig
from connectors.media.errors import MediaError
from connectors.media.pillow_limit import pillow_pixel_limit
from connectors.media.resize import smart_resize
from topics.formats.media import MediaItem

_ORIENTATION = 0x0112  # the EXIF tag saying how the camera was held
_TURNED = frozenset({5, 6, 7, 8})  # orientations that swap width and height
_WHITE = (255, 255, 255, 255)


def decode_image(source: io.BytesIO | Path, config: VisionConfig) -> MediaItem:
    """One image as a ``MediaItem`` (``token_offset`` 0): its first frame, upright (EXIF), RGB with any
    transparency over white (as ``rgb``), resized with BICUBIC to ``smart_resize`` of its size, pixels in
    ``config.encoding``. ``MediaError`` for what cannot be read, before decoding any pixel where the header
    already says the image is too large (``max_decoded_pixels``) or has a side of 0."""
    _, _, pixels = _resized_pixels(source, config)
    return config.item("image", pixels[np.newaxis])


def image_grid(source: io.BytesIO | Path, config: VisionConfig) -> tuple[int, int, int]:
    """The patch grid ``(1, h, w)`` that ``decode_image`` gives ``source``, from its header alone: Pillow opens
    lazily and no pixel is decoded. ``MediaError`` as ``decode_image`` for what its header refuses."""
    try:
        with pillow_pixel_limit(config.max_decoded_pixels), Image.open(source) as image:
            _check_header(image, config)
            width, height = image.size
            if image.getexif().get(_ORIENTATION, 1) in _TURNED:
                width, height = height, width
    except MediaError:
        raise
    except Image.DecompressionBombError as exc:
        raise MediaError(f"the image header says it is too large to decode safely: {exc}") from exc
    except UnidentifiedImageError as exc:
        raise MediaError("not an image Pillow can read (an unknown format, or a corrupt or zero-sized header)") from exc
    except Exception as exc:  # as in _resized_pixels: Pillow's many errors on a bad header
        raise MediaError(f"the image header does not parse: {type(exc).__name__}: {exc}") from exc
    height, width = smart_resize(
        height, width, factor=config.factor, min_pixels=config.min_pixels, max_pixels=config.max_pixels
    )
    return 1, height // config.patch_size, width // config.patch_size


def _resized_pixels(source: io.BytesIO | Path, config: VisionConfig) -> tuple[int, int, np.ndarray]:
    try:
        with pillow_pixel_limit(config.max_decoded_pixels), Image.open(source) as image:
            _check_header(image, config)
            image.load()
            upright = _upright(image)
            height, width = smart_resize(
                upright.height,
                upright.width,
                factor=config.factor,
                min_pixels=config.min_pixels,
                max_pixels=config.max_pixels,
            )
            resized = rgb(upright).resize((width, height), Image.Resampling.BICUBIC)
            return height, width, np.asarray(resized)
    except MediaError:
        raise
    except Image.DecompressionBombError as exc:
        raise MediaError(f"the image header says it is too large to decode safely: {exc}") from exc
    except UnidentifiedImageError as exc:
        reason = "not an image Pillow can read (an unknown format, or a corrupt or zero-sized header)"
        raise MediaError(reason) from exc
    except Exception as exc:  # Pillow raises OSError, SyntaxError, ValueError, struct.error ... on bad data
        raise MediaError(f"the image does not decode: {type(exc).__name__}: {exc}") from exc


def _check_header(image: Image.Image, config: VisionConfig) -> None:
    width, height = image.size
    if width < 1 or height < 1:
        raise MediaError(f"the image header says {width}x{height} pixels: a side of 0")
    if width * height > config.max_decoded_pixels:
        pixels = f"{width}x{height} = {width * height} pixels"
        raise MediaError(f"the image header says {pixels}, more than max_decoded_pixels {config.max_decoded_pixels}")


def _upright(image: Image.Image) -> Image.Image:
    """The image as it is meant to be seen: turned or mirrored as its EXIF orientation says."""
    if image.getexif().get(_ORIENTATION, 1) in (0, 1):
        return image
    return ImageOps.exif_transpose(image)


def rgb(image: Image.Image) -> Image.Image:
    """``image`` in RGB exactly as ``transformers``' ``convert_to_rgb`` makes it: an image with an alpha band
    or a ``transparency`` entry (a ``tRNS`` colour key or alpha palette, in any mode) composited over white,
    any other converted by Pillow (16-bit greyscale clipped at 255 as Pillow's conversion does)."""
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, _WHITE), rgba).convert("RGB")
    if image.mode == "RGB":
        return image
    return image.convert("RGB")
