"""The lab's arithmetic: float32, or bfloat16 mixed precision where the hardware has it.

``LabConfig.precision`` is ``"auto"`` (the default), ``"float32"`` or ``"bfloat16"``.
Under bfloat16 (Micikevicius et al. 2018, "Mixed Precision Training", with bfloat16
instead of float16, so no loss scaling), training and evaluation run the model under
``torch.autocast``: the matrix products of the blocks' projections and MLPs take
bfloat16 inputs and accumulate in float32. Everything else stays float32: the weights,
gradients and AdamW state, the layer norms, the attention core (rotation, bias, softmax,
weighted sum: ``MultiHeadAttention(attention_dtype=torch.float32)``), the output
projection and logits (``posenc.lab.model``), and the losses (summed in float64).

On a CPU with AVX-512 BF16 this makes those products about twice as fast and a training
step of the default model about 30 % faster; the attention core stays float32 because
SDPA's bfloat16 CPU backward is several times slower than float32's at the lab's head
size. ``"auto"`` picks bfloat16 only where it is native (emulated bfloat16 is slower than
float32). The run record keeps the resolved dtype; ``--precision float32`` trains and
evaluates in float32 throughout.
"""

from __future__ import annotations

import torch

__all__ = ["PRECISIONS", "autocast", "check_precision", "resolve_precision"]

#: ``LabConfig.precision`` values.
PRECISIONS = ("auto", "float32", "bfloat16")
_NATIVE_CPU = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")


def check_precision(precision: object) -> str:
    """Return ``precision`` after checking it is one of ``PRECISIONS``.

    Raises:
        ValueError: any other value, named.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return precision


def resolve_precision(precision: str, device: torch.device) -> torch.dtype:
    """The dtype of the lab's matrix products for ``precision`` on ``device``.

    ``"auto"`` is bfloat16 on a CPU with AVX-512 BF16 or AMX instructions and on a CUDA
    GPU with bfloat16 support, float32 elsewhere.

    Raises:
        ValueError: an unknown ``precision``.
    """
    if check_precision(precision) != "auto":
        return getattr(torch, precision)
    if device.type == "cuda":
        native = torch.cuda.is_bf16_supported()
    else:
        checks = (getattr(torch.cpu, name, None) for name in _NATIVE_CPU)
        native = device.type == "cpu" and any(check() for check in checks if check is not None)
    return torch.bfloat16 if native else torch.float32


def autocast(dtype: torch.dtype, device: torch.device) -> torch.autocast:
    """The autocast context of ``dtype`` on ``device`` (a no-op for float32)."""
    return torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)
