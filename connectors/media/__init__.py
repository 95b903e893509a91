"""Images and clips: decode, resize, sample frames, re-encode, and their placeholder tokens.

Nothing here is imported by a text source: Pillow and PyAV load with the first image or clip."""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
