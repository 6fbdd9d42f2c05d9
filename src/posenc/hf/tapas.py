"""TAPAS's positions: counted from 0 again in every table cell (Herzig et al. 2020,
"TaPas: Weakly Supervised Table Parsing via Pre-training", sec. 2; the
``reset_position_index_per_cell`` of its config, on in the released checkpoints).

Shapes: ``B`` batch, ``T`` length, ``K = 7`` token type channels.

A token's cell is the pair (column id, row id) of its ``token_type_ids[..., 1]`` and
``[..., 2]``; its position is its index minus the index of the cell's first token, capped
at ``max_len - 1``. The question, the separators and the padding share cell (0, 0), so
their positions are their indices when the question comes first. With the reset off,
TAPAS counts ``0 .. T-1`` like BERT. The table itself is ``build_position_module``'s
plain ``LearnedPositionalEncoding``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from posenc._checks import check_int

__all__ = ["tapas_positions"]


def tapas_positions(token_type_ids: Tensor, *, max_len: int) -> Tensor:
    """Positions ``[B, T]`` (int64) restarting in every cell, as TAPAS computes them.

    Args:
        token_type_ids: ``[B, T, K]`` integer ids, column in channel 1, row in channel 2.
        max_len: the table's rows (``max_position_embeddings``): positions are capped at
            ``max_len - 1``.

    Raises:
        ValueError: ``token_type_ids`` not ``[B, T, K >= 3]`` integers, negative ids.
        TypeError: a non-integer ``max_len``.
    """
    max_len = check_int("max_len", max_len)
    ids = token_type_ids
    if (
        not isinstance(ids, Tensor)
        or ids.dim() != 3
        or ids.shape[-1] < 3
        or ids.is_floating_point()
    ):
        shape = tuple(ids.shape) if isinstance(ids, Tensor) else type(ids).__name__
        raise ValueError(f"token_type_ids must be integers [B, T, K >= 3], got {shape}")
    if ids.numel() and int(ids[..., 1:3].min()) < 0:
        raise ValueError("token_type_ids has a negative column or row id")
    batch, length = ids.shape[:2]
    rows = int(ids[..., 2].max()) + 1 if ids.numel() else 1
    cell = (ids[..., 1] * rows + ids[..., 2]).to(torch.int64)  # [B, T]
    index = torch.arange(length, device=ids.device).expand(batch, -1)
    first = torch.full(
        (batch, int(cell.max()) + 1 if ids.numel() else 1), length, device=ids.device
    )
    first = first.scatter_reduce(1, cell, index, reduce="amin")  # [B, cells]
    return (index - first.gather(1, cell)).clamp(max=max_len - 1)
