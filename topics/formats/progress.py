"""Records of ``<job>.progress``: the step a rank's trainer has reached, keyed by rank.

A sink writes them (``trainer_sink/progress.py``); a constructor with ``max_lead_steps`` reads them
(``pipeline/roles/constructor/lead.py``). The topic is compacted, so each rank's latest report is kept."""

from __future__ import annotations

import json

from topics.errors import DecodeError


def encode_progress(rank: int, step: int) -> tuple[bytes, bytes]:
    """``(key, value)`` of a report that ``rank``'s trainer holds every step up to ``step`` whole."""
    return str(rank).encode(), json.dumps({"rank": rank, "step": step}).encode()


def decode_progress(value: bytes | None) -> tuple[int, int]:
    """``(rank, step)`` of a report; ``DecodeError`` for anything else."""
    try:
        body = json.loads(value or b"")
        rank, step = body["rank"], body["step"]
    except (ValueError, TypeError, KeyError) as exc:
        msg = f"not a progress report: {exc}"
        raise DecodeError(msg) from exc
    if not (isinstance(rank, int) and isinstance(step, int)) or rank < 0 or step < -1:
        msg = f"not a progress report: rank {rank!r}, step {step!r}"
        raise DecodeError(msg)
    return rank, step
