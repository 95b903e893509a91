"""The error every media problem a source can hold becomes: the sample builder turns it into a dead letter."""

from __future__ import annotations

from topics.errors import MixflowError


class MediaError(MixflowError):
    """An image or clip that cannot become a media item: missing, corrupt, truncated, an unsupported codec, no
    frames, too large, or a shape the model cannot take. ``reason`` says which, in words."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)
