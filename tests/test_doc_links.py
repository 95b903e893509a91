"""Every relative link in the repository's Markdown files reaches a file that exists, and every anchor a
heading of the file it names (GitHub's heading ids)."""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", flags=re.MULTILINE | re.DOTALL)
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", flags=re.MULTILINE)


def markdown_files() -> list[Path]:
    tracked = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [ROOT / name for name in tracked.stdout.split()]


def slug(heading: str) -> str:
    """GitHub's id for a heading: markup and punctuation dropped, lower case, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    ids = set()
    for heading in HEADING.findall(text):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        ids.add(base if count == 0 else f"{base}-{count}")
    return frozenset(ids)


def broken_links(path: Path) -> list[str]:
    problems = []
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    text = re.sub(r"`[^`\n]*`", "", text)  # inline code is not a link
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / unquote(file_part)).resolve() if file_part else path
        where = f"{path.relative_to(ROOT)}: {target}"
        if not linked.exists():
            problems.append(f"{where}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            problems.append(f"{where}: no heading with id {anchor!r}")
    return problems


def test_slugs_follow_github() -> None:
    assert slug("Replay, and resuming on another number of GPUs") == "replay-and-resuming-on-another-number-of-gpus"
    assert slug("The sink under a training step (NVIDIA H200)") == "the-sink-under-a-training-step-nvidia-h200"
    assert slug("Watching a job: `mixflow top` and `mixflow report`") == "watching-a-job-mixflow-top-and-mixflow-report"
    assert slug("Step composition, simulated") == "step-composition-simulated"


def test_every_relative_link_and_anchor_resolves() -> None:
    files = markdown_files()
    assert ROOT / "README.md" in files
    problems = [problem for path in files for problem in broken_links(path)]
    assert not problems, "broken links:\n" + "\n".join(problems)
