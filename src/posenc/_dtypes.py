"""The dtype positional arithmetic runs in.

float64 inputs are computed in float64; every other floating dtype (float32, bf16, fp16)
in float32, with the result rounded once to the input's dtype (numerics policy).
"""

from __future__ import annotations

import torch


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 for float64, float32 for every other (half or single) dtype."""
    return torch.float64 if dtype == torch.float64 else torch.float32
