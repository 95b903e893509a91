"""The sink's state as files in a framework's checkpoint folder: one per data-parallel rank.

Data-parallel ranks train in lockstep and checkpoint between steps, where any rank's state names the step
to go on from (``KafkaBatchDataset.load_state_dict`` finds it on its own topic by number). So a rank
resumes from its own file when there is one and from the lowest rank's otherwise: after a change of world
size (a job replayed with ``mixflow replay --ranks``) the new ranks beyond the old ones take rank 0's."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from topics.errors import MixflowError

FILE_PATTERN = re.compile(r"mixflow-sink-rank(\d+)\.json")


def sink_state_path(folder: str | os.PathLike[str], rank: int) -> Path:
    return Path(folder) / f"mixflow-sink-rank{rank}.json"


def write_sink_state(folder: str | os.PathLike[str], rank: int, ranks: int, state: Mapping[str, Any]) -> Path:
    """Write data-parallel rank ``rank``'s (of ``ranks``) sink state into ``folder``: to a temporary name
    first, then renamed into place, so that a kill leaves either no file or a whole one."""
    path = sink_state_path(folder, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    body = json.dumps({"rank": rank, "ranks": ranks, "sink": dict(state)}, indent=1) + "\n"
    with open(temporary, "w") as file:
        file.write(body)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
    return path


def saved_ranks(folder: str | os.PathLike[str]) -> list[int]:
    """The data-parallel ranks whose sink state ``folder`` holds, in order."""
    if not Path(folder).is_dir():
        return []
    found = (FILE_PATTERN.fullmatch(entry.name) for entry in Path(folder).iterdir())
    return sorted(int(match.group(1)) for match in found if match)


def read_sink_state(folder: str | os.PathLike[str], rank: int) -> dict[str, Any]:
    """The sink state for data-parallel rank ``rank`` from ``folder``: its own, or the lowest rank's.
    Raises ``MixflowError`` when the folder holds none: resuming without it would restart the stream."""
    ranks = saved_ranks(folder)
    if not ranks:
        msg = (
            f"checkpoint {folder} holds no mixflow sink state (mixflow-sink-rank<r>.json): it was not written by a "
            "mixflow integration, or the save was cut short; resuming from it would start the data stream over"
        )
        raise MixflowError(msg)
    chosen = rank if rank in ranks else ranks[0]
    saved = json.loads(sink_state_path(folder, chosen).read_text())
    return saved["sink"]
