"""What torchtitan and Megatron-Core assume of a GPU, stood in for on the CPU, for the training scripts the tests
run under torchrun (gloo): each function is called before the framework's modules are imported, as they bind
the device at import.

- torchtitan 0.3 (``torchtitan_on_cpu``): the device module (``torchtitan.tools.utils``: ``torch.cpu`` has no
  ``get_device_name``, memory stats or ``set_device``, which the trainer and its metrics call; with no
  accelerator torchtitan picks ``cuda``), and the attention kernel (FlexAttention has no backward on CPU, so
  the same mask, torchtitan's causal and document mask built from the batch's ``positions``, is applied
  densely with ``scaled_dot_product_attention``); ``torchtitan_eager_masks``, its masks built without compiling.
- Megatron-Core (``megatron_on_cpu``): ``torch.cuda.current_device()`` (the attention's buffers, the rotary
  embedding), tensors made on ``"cuda"`` (the schedule's token counter: ``CpuForCuda``), and the CUDA RNG
  tracker its attention forks (no dropout in the tests)."""

from __future__ import annotations

import contextlib
import types
from typing import Any

import torch
from torch.overrides import TorchFunctionMode


class _Capacity:
    total_memory = 1 << 34


def torchtitan_on_cpu() -> None:
    import torchtitan.tools.utils as titan_utils

    titan_utils.device_type = "cpu"
    titan_utils.device_module = types.SimpleNamespace(
        set_device=lambda device: None,
        device_count=lambda: 1,
        current_device=lambda: 0,
        synchronize=lambda *args: None,
        get_device_name=lambda *args: "cpu",
        get_device_properties=lambda *args: _Capacity(),
        reset_peak_memory_stats=lambda *args: None,
        empty_cache=lambda: None,
        memory_stats=lambda *args: {},
    )
    # Imported after the device module is in place.
    from torchtitan.models.common.attention import FlexAttention

    FlexAttention._compiled_flex_attn = staticmethod(dense_flex_attention)


def dense_flex_attention(q, k, v, *, score_mod, block_mask, scale, enable_gqa, return_aux, kernel_options):
    """FlexAttention's kernel as torchtitan calls it, dense: its ``block_mask``'s ``mask_mod`` over every query and
    key (there may be more keys than queries: a context-parallel rank's queries over its group's keys)."""
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import create_mask

    mask = create_mask(block_mask.mask_mod, q.shape[0], None, q.shape[-2], k.shape[-2], device=q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=enable_gqa), None


def torchtitan_eager_masks() -> None:
    """torchtitan's masks built by ``create_block_mask`` as it is: compiling it for the CPU takes longer than a short
    test run trains, and the mask is the same."""
    from torch.nn.attention.flex_attention import create_block_mask
    from torchtitan.models.common import attention

    attention._compiled_create_block_mask = create_block_mask


class CpuForCuda(TorchFunctionMode):
    """Tensors asked for on ``"cuda"`` are made on the CPU."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = dict(kwargs or {})
        if str(kwargs.get("device")) == "cuda":
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)


def megatron_on_cpu() -> None:
    """The stand-ins but ``CpuForCuda``, which the caller enters around Megatron-Core's schedule."""
    torch.cuda.current_device = lambda: "cpu"  # before Megatron-Core binds anything to it
    from megatron.core.tensor_parallel import random as megatron_random

    megatron_random.get_cuda_rng_tracker().fork = lambda *args, **kwargs: contextlib.nullcontext()
