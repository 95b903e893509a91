"""A small vision-language model for the multimodal example: a tiny ViT whose merged patches replace the
placeholder tokens of ``examples/gpt.py``'s GPT (the LLaVA / Qwen2-VL shape, randomly initialised).

The vision tower takes the sink's ``pixel_values`` (``[patches, 3 * temporal * patch * patch]``, patches in
the Qwen2-VL order: merge windows of ``merge x merge`` patches consecutive) and the grids
``[n, 3]``; attention stays within each image or clip (a block-diagonal mask from the grids); each merge
window becomes one embedding of the LLM's width, and those replace, in order, the placeholder tokens of
``input_ids``. Images and clips go through the tower separately (``pixel_values`` with ``image_grid_thw``,
``pixel_values_videos`` with ``video_grid_thw``), as Qwen2-VL takes them.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gpt
import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class VisionConfig:
    patch_dim: int  # 3 * temporal_patch_size * patch_size**2
    width: int = 64
    depth: int = 2
    heads: int = 4
    merge_size: int = 2
    max_grid: int = 64  # patches per side the position tables cover
    image_token_id: int = 0
    video_token_id: int = 0


def add_vision_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("vision tower (multimodal jobs)")
    group.add_argument(
        "--vision", action="store_true", help="train a VLM: a vision tower laid out as the spec's vision sections say"
    )
    group.add_argument("--vision-width", type=int, default=64)
    group.add_argument("--vision-depth", type=int, default=2)


class _Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor, same_item: torch.Tensor) -> torch.Tensor:
        n, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(n, 3, self.heads, d // self.heads).permute(1, 2, 0, 3)
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=same_item)
        x = x + self.out(attended.transpose(0, 1).reshape(n, d))
        return x + self.mlp(self.norm2(x))


class VisionTower(nn.Module):
    """Patches of several images or clips -> one embedding of ``out_dim`` per merge window."""

    def __init__(self, config: VisionConfig, out_dim: int) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Linear(config.patch_dim, config.width)
        self.rows = nn.Embedding(config.max_grid, config.width)
        self.cols = nn.Embedding(config.max_grid, config.width)
        self.blocks = nn.ModuleList(_Block(config.width, config.heads) for _ in range(config.depth))
        self.merge = nn.Sequential(
            nn.LayerNorm(config.width * config.merge_size**2), nn.Linear(config.width * config.merge_size**2, out_dim)
        )

    def _layout(self, grid_thw: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Each patch's row, column and item, in the Qwen2-VL patch order."""
        m = self.config.merge_size
        rows, cols, items = [], [], []
        for k, (t, h, w) in enumerate(grid_thw.tolist()):
            r = torch.arange(h, device=device).view(h // m, m, 1, 1).expand(h // m, m, w // m, m)
            c = torch.arange(w, device=device).view(1, 1, w // m, m).expand(h // m, m, w // m, m)
            rows.append(r.permute(0, 2, 1, 3).reshape(-1).repeat(t))
            cols.append(c.permute(0, 2, 1, 3).reshape(-1).repeat(t))
            items.append(torch.full((t * h * w,), k, device=device))
        return torch.cat(rows), torch.cat(cols), torch.cat(items)

    def forward(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        rows, cols, items = self._layout(grid_thw, pixel_values.device)
        limit = self.config.max_grid - 1
        x = self.embed(pixel_values) + self.rows(rows.clamp(max=limit)) + self.cols(cols.clamp(max=limit))
        same_item = items[:, None] == items[None, :]
        for block in self.blocks:
            x = block(x, same_item)
        return self.merge(x.reshape(-1, self.config.width * self.config.merge_size**2))


class VLM(nn.Module):
    """``gpt.GPT`` whose placeholder tokens take the vision tower's embeddings; called as the GPT is, plus the
    sink's media keys (``gpt.MEDIA_KEYS``) when the micro-batch has images or clips."""

    def __init__(self, llm: gpt.GPT, vision: VisionConfig) -> None:
        super().__init__()
        self.config = llm.config
        self.llm = llm
        self.vision = VisionTower(vision, llm.config.d_model)

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        cu_seqlens: torch.Tensor,
        max_seqlen: int,
        **media: torch.Tensor,
    ) -> torch.Tensor:
        embeds = self.llm.embed(input_ids)
        used = False
        for pixels, grids, token in (
            ("pixel_values", "image_grid_thw", self.vision.config.image_token_id),
            ("pixel_values_videos", "video_grid_thw", self.vision.config.video_token_id),
        ):
            if grids in media and media[grids].numel():
                merged = self.vision(media[pixels], media[grids])
                where = (input_ids == token).nonzero().squeeze(1)
                embeds = embeds.index_put((where,), merged.to(embeds.dtype))
                used = True
        if not used:  # DDP reduces every parameter's gradient: the tower's are zero in a text-only micro-batch
            embeds = embeds + 0.0 * sum(p.reshape(-1)[0] for p in self.vision.parameters())
        return self.llm(input_ids, position_ids, cu_seqlens, max_seqlen, inputs_embeds=embeds)


def without_placeholder_labels(micro_batch: dict[str, Any], config: VisionConfig) -> dict[str, Any]:
    """The micro-batch with ``-100`` for labels that are placeholder tokens (nothing to learn there)."""
    labels = micro_batch["labels"]
    placeholder = (labels == config.image_token_id) | (labels == config.video_token_id)
    if bool(placeholder.any()):
        micro_batch = {**micro_batch, "labels": labels.masked_fill(placeholder, gpt.IGNORE_INDEX)}
    return micro_batch


def from_spec(llm: gpt.GPT, spec_path: str, args: argparse.Namespace) -> VLM:
    """The VLM for the job's multimodal sources (their vision sections must agree on the patch layout)."""
    import yaml

    spec = yaml.safe_load(Path(spec_path).read_text(encoding="utf-8"))
    sections = [s["vision"] for s in spec["sources"] if s.get("vision")]
    if not sections:
        raise SystemExit(f"--vision: no source of {spec_path} has a vision section")
    first = sections[0]
    patch, temporal, merge = (
        first.get("patch_size", 14),
        first.get("temporal_patch_size", 2),
        first.get("merge_size", 2),
    )
    config = VisionConfig(
        patch_dim=3 * temporal * patch * patch,
        width=args.vision_width,
        depth=args.vision_depth,
        merge_size=merge,
        image_token_id=first["image_token_id"],
        video_token_id=first["video_token_id"],
    )
    return VLM(llm, config)
