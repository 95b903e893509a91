"""Images and clips: decode, resize, sample frames, re-encode, and their placeholder tokens."""
