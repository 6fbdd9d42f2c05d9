"""Run by ``tests/test_data_dependent.py`` in its own process: posenc's FoX, stick-breaking
and PaTH next to flash-linear-attention's kernels (``fla-core``) on the same inputs.

Triton builds every ``@triton.jit`` function (its own ``tl.cdiv`` included) when it is
imported, interpreted or not; a test process may already hold them built for a GPU (torch
and transformers import Triton), so the interpreted run gets a process of its own, with
``TRITON_INTERPRET=1`` set before any import. fla's autotuner cannot time its configs
without a GPU driver, so each kernel keeps its first config.

Usage: ``python _fla_worker.py OUT.pt``; writes ``{case: {"posenc": t, "fla": t,
"naive": t}}`` (``[B, H, T, D]`` float32 tensors).

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head_dim.
"""

from __future__ import annotations

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import torch
import triton.runtime.autotuner as autotuner
from fla.ops.forgetting_attn import parallel_forgetting_attn
from fla.ops.forgetting_attn.naive import naive_forgetting_attn
from fla.ops.path_attn import naive_path_attn, parallel_path_attn
from fla.ops.stickbreaking_attn import parallel_stickbreaking_attn
from fla.ops.stickbreaking_attn.naive import naive_stickbreaking_attn

from posenc.attention.backends import Masking, attend
from posenc.encodings import ForgettingAttention, PaTH, StickBreakingAttention

autotuner.Autotuner._bench = lambda self, *args, config=None, **kwargs: [0.0, 0.0, 0.0]

B, H, T, D = 2, 4, 16, 16


def _bthd(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(1, 2).contiguous()  # [B, H, T, D] -> fla's [B, T, H, D]


def _ours(enc, q, k, v, gates) -> torch.Tensor:
    pos = torch.arange(T)
    return attend(q, k, v, position=enc, masking=Masking(True, pos, pos), block_size=8, gates=gates)


def main(out: str) -> None:
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, T, D, generator=gen) for _ in range(3))
    qkv = (_bthd(q), _bthd(k), _bthd(v))
    results = {}

    log_f = torch.nn.functional.logsigmoid(torch.randn(B, H, T, generator=gen) + 2.0)
    cum = log_f.cumsum(-1).unsqueeze(-1)  # what ForgettingAttention.gates returns
    g = log_f.transpose(1, 2).contiguous()
    results["fox"] = {
        "posenc": _ours(ForgettingAttention(H * D, H), q, k, v, cum),
        "fla": parallel_forgetting_attn(*qkv, g).transpose(1, 2),
        "naive": naive_forgetting_attn(*qkv, g).transpose(1, 2),
    }

    for current in (False, True):
        enc = StickBreakingAttention(attend_current=current)
        results[f"stick_breaking-{current}"] = {
            "posenc": _ours(enc, q, k, v, q.new_zeros(B, 1, T, 0)),
            "fla": parallel_stickbreaking_attn(*qkv, attend_current=current)[0].transpose(1, 2),
            "naive": naive_stickbreaking_attn(*qkv, attend_current=current)[0].transpose(1, 2),
        }

    w = torch.nn.functional.normalize(torch.randn(B, H, T, D, generator=gen), dim=-1)
    beta = 2 * torch.sigmoid(torch.randn(B, H, T, generator=gen))
    index = torch.arange(T, dtype=torch.float32).expand(B, H, T)
    gates = torch.cat((w, beta[..., None], index[..., None]), dim=-1)
    args = (*qkv, _bthd(w), beta.transpose(1, 2).contiguous())
    zero_g = torch.zeros(B, T, H)
    results["path"] = {
        "posenc": _ours(PaTH(H * D, H, chunk_size=6), q, k, v, gates),
        "fla": parallel_path_attn(*args, g=zero_g, scale=D**-0.5)[0].transpose(1, 2),
        "naive": naive_path_attn(*args, zero_g, D**-0.5, chunk_size=8).transpose(1, 2),
    }
    torch.save(results, out)


if __name__ == "__main__":
    main(sys.argv[1])
