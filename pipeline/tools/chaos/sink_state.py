"""A chaos sink's checkpoint: the sink's state after some whole steps, and how much of its record holds
them. Read by the sink process when it restarts, and by the chaos run to see a sink's progress."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHECKPOINT_FILE = "sink-rank{rank}.json"


@dataclass(frozen=True)
class SinkCheckpoint:
    """The sink's state after ``steps`` whole steps, and the bytes of the record that hold them."""

    state: dict[str, Any] | None = None
    received_bytes: int = 0
    steps: int = 0

    @classmethod
    def read(cls, path: Path) -> SinkCheckpoint:
        if not path.exists():
            return cls()
        body = json.loads(path.read_text())
        return cls(body["sink"], body["received_bytes"], body["steps"])

    def write(self, path: Path) -> None:
        """Replace the checkpoint at once: a kill leaves the old one or the new one."""
        temporary = path.with_name(f".{path.name}.tmp")
        body = {"sink": self.state, "received_bytes": self.received_bytes, "steps": self.steps}
        temporary.write_text(json.dumps(body))
        os.replace(temporary, path)


def checkpoint_steps(folder: Path, rank: int) -> int:
    """The steps rank ``rank``'s sink has received and checkpointed (0 before its first checkpoint)."""
    try:
        return SinkCheckpoint.read(folder / CHECKPOINT_FILE.format(rank=rank)).steps
    except (OSError, ValueError, KeyError):
        return 0
