"""DAPE: data-adaptive positional encoding (Zheng, Gao, Shi, Yang, Xiong, Li, Li and Li
2024, "DAPE: Data-Adaptive Positional Encoding for Length Extrapolation", NeurIPS 2024,
eq. (4)).

Shapes: ``B`` batch, ``H`` heads, ``Tq`` queries, ``Tk`` keys, ``D`` head_dim, ``W`` the
MLP's width. The logits of every head get a static positional bias ``B`` (KERPLE's log
kernel by default, the paper's main setting) and a correction computed from the logits
and the bias together, one small MLP applied at every ``(i, j)`` across the heads:

    A = Q K^T / sqrt(D) + B + f(Q K^T / sqrt(D), B)
    f(a, b) = W2 LeakyReLU(W1 [a_1 .. a_H, b_1 .. b_H] + c1) + c2     (2H -> W -> H)

as in the authors' code (``nn.Linear(2H, W)``, ``LeakyReLU`` with slope 0.01,
``nn.Linear(W, H)``; ``W = 32``). This is a SCORE-site encoding whose bias is ``B + f``:
it reads the queries and keys (scaled by ``1 / sqrt(D)``, the layer's scale), so every
query block and every decoding step computes its own rows; the MLP mixes heads, never
positions, so masked keys stay masked.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from posenc._checks import check_int, check_tensor
from posenc.base import PositionalEncoding, Site, register
from posenc.encodings._relative import check_hook_inputs
from posenc.encodings.kerple import KERPLE

__all__ = ["DAPE", "dape_bias"]

NEGATIVE_SLOPE = 0.01  # nn.LeakyReLU's default, the authors' activation


def dape_bias(logits: Tensor, bias: Tensor, mlp: nn.Sequential) -> Tensor:
    """``B + f(logits, B)`` for ``logits [B, H, Tq, Tk]`` and ``bias [B|1, H, Tq, Tk]``.

    Args:
        logits: the scaled dot products ``q . k / sqrt(D)``.
        bias: the static positional bias.
        mlp: ``Linear(2H, W), LeakyReLU, Linear(W, H)``.

    Returns:
        ``[B, H, Tq, Tk]`` in ``logits``' dtype.

    Raises:
        ValueError: ``logits`` and ``bias`` of other ranks, heads or lengths.
    """
    check_tensor("logits", logits, ndim=4, allow_meta=True)
    check_tensor("bias", bias, ndim=4, allow_meta=True)
    if bias.shape[1:] != logits.shape[1:] or bias.shape[0] not in (1, logits.shape[0]):
        raise ValueError(
            f"bias {tuple(bias.shape)} must broadcast to the logits {tuple(logits.shape)}"
        )
    weight = mlp[0].weight
    features = torch.cat((logits, bias.to(logits.dtype).expand_as(logits)), dim=1)
    features = features.movedim(1, -1).to(weight.dtype)  # [B, Tq, Tk, 2H]
    correction = mlp(features).movedim(-1, 1).to(logits.dtype)  # [B, H, Tq, Tk]
    return bias.to(logits.dtype) + correction


@register(
    "dape",
    paper="Zheng et al. 2024, DAPE: Data-Adaptive Positional Encoding for Length "
    "Extrapolation (NeurIPS)",
    description="an MLP across heads over the logits and a KERPLE bias, added with the "
    "bias to the logits",
)
class DAPE(PositionalEncoding):
    """DAPE as a SCORE-site encoding.

    Args:
        num_heads: ``H``.
        width: ``W``, the MLP's hidden width.
        bias: the static bias, a SCORE-only encoding for ``num_heads`` heads; None:
            ``KERPLE(num_heads)`` (log kernel).

    Attributes:
        static: the static bias encoding.
        mlp: ``Sequential(Linear(2H, W), LeakyReLU(0.01), Linear(W, H))``.

    Raises:
        ValueError: ``num_heads`` or ``width`` < 1.
        TypeError: a ``bias`` that is not a SCORE-only ``PositionalEncoding``.
    """

    sites = Site.SCORE

    def __init__(
        self, num_heads: int, *, width: int = 32, bias: PositionalEncoding | None = None
    ) -> None:
        super().__init__()
        self.num_heads = check_int("num_heads", num_heads)
        self.width = check_int("width", width)
        if bias is None:
            bias = KERPLE(self.num_heads)
        if not isinstance(bias, PositionalEncoding) or bias.sites != Site.SCORE:
            raise TypeError(
                "bias must be a PositionalEncoding acting at the SCORE site only, got "
                f"{type(bias).__name__}"
            )
        self.static = bias
        self.mlp = nn.Sequential(
            nn.Linear(2 * self.num_heads, self.width),
            nn.LeakyReLU(NEGATIVE_SLOPE),
            nn.Linear(self.width, self.num_heads),
        )

    def score_bias(self, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """``[B, H, Tq, Tk]`` bias ``B + f`` in ``q``'s dtype."""
        q_pos, k_pos = check_hook_inputs(q, k, q_pos, k_pos, num_heads=self.num_heads, module=self)
        static = self.static.score_bias(q, k, q_pos, k_pos)  # [B|1, H, Tq, Tk]
        logits = torch.matmul(q, k.to(q.dtype).transpose(-2, -1)) * q.shape[-1] ** -0.5
        return dape_bias(logits, static, self.mlp)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, width={self.width}"
