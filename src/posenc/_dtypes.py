"""The dtype positional arithmetic runs in.

float64 inputs are computed in float64; every other floating dtype (float32, bf16, fp16)
in float32, with the result rounded once to the input's dtype (numerics policy).
``without_autocast`` leaves an active ``torch.autocast`` region for code that must keep
its own dtype (on devices without autocast, such as ``meta``, it does nothing).
"""

from __future__ import annotations

import contextlib

import torch


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 for float64, float32 for every other (half or single) dtype."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def autocast_enabled(device_type: str) -> bool:
    """Whether a ``torch.autocast`` region is active for ``device_type`` (False on devices
    that have no autocast)."""
    return torch.amp.is_autocast_available(device_type) and torch.is_autocast_enabled(device_type)


def without_autocast(device_type: str) -> contextlib.AbstractContextManager:
    """A context with autocast off for ``device_type`` (a no-op where none is active)."""
    if autocast_enabled(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()
