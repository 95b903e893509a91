"""Images and clips: decode, resize, sample frames, re-encode, and their placeholder tokens.

Nothing here is imported by a text source: Pillow and PyAV load with the first image or clip."""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "config": ["VisionConfig"],
        "decode": ["MediaDecoder"],
        "errors": ["MediaError"],
        "frame_sampling": ["FramePicker", "clip_span", "padded_count", "pick_frames", "sample_times"],
        "image": ["decode_image"],
        "placeholders": ["block_length", "placeholder_block"],
        "refs": ["media_input"],
        "resize": ["MAX_ASPECT_RATIO", "smart_resize"],
        "video": ["decode_video"],
    },
)
