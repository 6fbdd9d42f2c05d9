"""RoPE benchmark: ``apply_rope`` against the copy floor and the popular implementations.

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head_dim. Each group rotates a
query and a key ``[B, H, T, D]``. The floor copies both into preallocated tensors (one
read and one write each, the least any rotation can do); an out-of-place rotation must
also allocate its output, whose floor is the copy into a fresh tensor (the operating
system zeroes new pages on first touch): with 4 KiB pages (``torch.empty_like``, what
``apply_rope`` uses) and with huge pages (``fastpath.empty_like``). The other baselines
are the transformers-style expression ``x * cos + rotate_half(x) * sin``, Meta's complex
multiply, and, when installed, transformers' ``apply_rotary_pos_emb`` and
``rotary-embedding-torch``'s ``apply_rotary_emb`` (neither is a dependency of posenc).
The in-place cases rotate ``q`` and ``k`` themselves, again and again (a rotation keeps
their norms), so that every case reads the same tensors and finds them as warm in the
caches as the floor does: at ``[4, 16, 2048, 64]`` bfloat16, q and k together are the
size of a 32 MiB L3, where copies that only the in-place cases touched would start
colder than the floor's inputs. Both copy floors are also timed a second time as cases
of their own (``CONTROLS``, ``timing.with_control``): how far a call lands from itself
in the run bounds what any ratio to it can resolve.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import Tensor

from posenc.bench.timing import Group, measure, with_control
from posenc.encodings.rotary.apply import apply_rope, apply_rope_
from posenc.encodings.rotary.module import RotaryEmbedding
from posenc.fastpath import empty_like

__all__ = [
    "BACKWARD_FLOOR",
    "CLONE",
    "CONTROLS",
    "FLOOR",
    "HF_STYLE",
    "LAYOUTS",
    "posenc_cases",
    "rope_groups",
]

FLOOR = "copy (preallocated)"
CLONE = "copy (fresh, 4 KiB pages)"  # the floor of an out-of-place rotation
BACKWARD_FLOOR = "copy x2 (fwd + bwd)"
HF_STYLE = "x*cos + rotate_half(x)*sin"
#: The forward floors' A/A controls: the same copies timed again (``timing.with_control``).
CONTROLS = {FLOOR: "copy (preallocated) again", CLONE: "copy (fresh, 4 KiB) again"}
LAYOUTS = (("half", False), ("intl", True))  # half-split, interleaved

FULL = (((4, 16, 2048, 64), torch.float32), ((1, 32, 8192, 128), torch.float32))
FULL += (((4, 16, 2048, 64), torch.bfloat16),)
QUICK = (((1, 2, 32, 16), torch.float32), ((1, 2, 32, 16), torch.bfloat16))

Pair = tuple[Tensor, Tensor]


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _hf_style(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    return x * cos + _rotate_half(x) * sin


def _meta_style(x: Tensor, freqs: Tensor) -> Tensor:
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))  # [B, H, T, D/2]
    return torch.view_as_real(pairs * freqs).flatten(-2).type_as(x)


def _optional_baselines(
    angles: Tensor, cos_full: Tensor, sin_full: Tensor
) -> dict[str, Callable[[Tensor, Tensor], Pair]]:
    """transformers' and rotary-embedding-torch's own functions, where importable, each
    called as its users call it on a query and a key: ``apply_rotary_pos_emb(q, k, ...)``
    rotates both in one call, ``apply_rotary_emb(freqs, x)`` one tensor a call."""
    found: dict[str, Callable[[Tensor, Tensor], Pair]] = {}
    try:
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    except ImportError:
        pass
    else:
        cos_b, sin_b = cos_full[None], sin_full[None]  # [1, T, D], as Llama passes them
        found["HF apply_rotary_pos_emb"] = lambda q, k: apply_rotary_pos_emb(q, k, cos_b, sin_b)
    try:
        from rotary_embedding_torch import apply_rotary_emb
    except ImportError:
        pass
    else:
        freqs = angles.repeat_interleave(2, dim=-1)  # [T, D], its interleaved layout
        found["rotary-embedding-torch"] = _pairwise(lambda x: apply_rotary_emb(freqs, x))
    return found


def _pairwise(fn: Callable[[Tensor], Tensor]) -> Callable[[Tensor, Tensor], Pair]:
    """``fn`` applied to the query and to the key."""
    return lambda q, k: (fn(q), fn(k))


def _both(fn: Callable[[Tensor], Tensor], q: Tensor, k: Tensor) -> Callable[[], Pair]:
    return functools.partial(_pairwise(fn), q, k)


def _inputs(shape: tuple[int, ...], dtype: torch.dtype, seed: int = 0) -> dict[str, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    _, _, length, dim = shape
    rope = RotaryEmbedding(dim)
    positions = torch.arange(length)
    cos, sin = rope.cos_sin(positions, dtype=torch.float32)  # [T, D/2]
    angles = positions[:, None].double() * rope.inv_freq.double()
    return {
        "q": torch.randn(shape, generator=gen).to(dtype),
        "k": torch.randn(shape, generator=gen).to(dtype),
        "cos": cos,
        "sin": sin,
        "angles": angles.float(),
        "cos_full": torch.cat((cos, cos), dim=-1).to(dtype),  # [T, D] as HF builds it
        "sin_full": torch.cat((sin, sin), dim=-1).to(dtype),
    }


def _forward_cases(t: dict[str, Tensor]) -> dict[str, Callable[[], object]]:
    q, k, cos, sin = t["q"], t["k"], t["cos"], t["sin"]
    out_q, out_k = torch.empty_like(q), torch.empty_like(k)
    freqs = torch.polar(torch.ones_like(t["angles"]), t["angles"])  # [T, D/2] complex
    rope, rope_i = RotaryEmbedding(q.shape[-1]), RotaryEmbedding(q.shape[-1], interleaved=True)
    cases: dict[str, Callable[[], object]] = {
        FLOOR: lambda: (out_q.copy_(q), out_k.copy_(k)),
        CLONE: lambda: (q.clone(), k.clone()),
        "copy (fresh, huge pages)": lambda: (empty_like(q).copy_(q), empty_like(k).copy_(k)),
        HF_STYLE: _both(lambda x: _hf_style(x, t["cos_full"], t["sin_full"]), q, k),
        "Meta complex multiply": _both(lambda x: _meta_style(x, freqs), q, k),
    }
    for name, fn in _optional_baselines(t["angles"], t["cos_full"], t["sin_full"]).items():
        cases[name] = lambda fn=fn: fn(q, k)
    for layout, inter in LAYOUTS:
        cases[f"apply_rope {layout}"] = _both(
            lambda x, i=inter: apply_rope(x, cos, sin, interleaved=i), q, k
        )
        cases[f"apply_rope_ {layout} (in place)"] = _both(
            lambda x, i=inter: apply_rope_(x, cos, sin, interleaved=i), q, k
        )
    cases["RotaryEmbedding half"] = lambda: rope(q, k)
    cases["RotaryEmbedding intl"] = lambda: rope_i(q, k)
    return with_control(cases, CONTROLS)


def _train_step(fn: Callable[[Tensor, Tensor], Pair], q: Tensor, k: Tensor) -> Callable[[], object]:
    """Forward and backward of ``fn(q, k)`` with a fixed upstream gradient."""
    q, k = q.detach().requires_grad_(), k.detach().requires_grad_()
    grads = (torch.randn_like(q), torch.randn_like(k))
    return lambda: torch.autograd.grad(fn(q, k), (q, k), grads)


def _backward_cases(t: dict[str, Tensor]) -> dict[str, Callable[[], object]]:
    q, k, cos, sin = t["q"], t["k"], t["cos"], t["sin"]
    outs = [torch.empty_like(q) for _ in range(4)]
    cases: dict[str, Callable[[], object]] = {
        BACKWARD_FLOOR: lambda: (
            outs[0].copy_(q),
            outs[1].copy_(k),
            outs[2].copy_(q),
            outs[3].copy_(k),
        ),
        HF_STYLE: _train_step(
            _pairwise(lambda x: _hf_style(x, t["cos_full"], t["sin_full"])), q, k
        ),
    }
    for name, fn in _optional_baselines(t["angles"], t["cos_full"], t["sin_full"]).items():
        cases[name] = _train_step(fn, q, k)
    for layout, inter in LAYOUTS:
        cases[f"apply_rope {layout}"] = _train_step(
            _pairwise(lambda x, i=inter: apply_rope(x, cos, sin, interleaved=i)), q, k
        )
    return cases


def posenc_cases(group: Group) -> list[str]:
    """The cases of a group that run posenc's code."""
    return [c for c in group.stats if c.startswith(("apply_rope", "RotaryEmbedding"))]


def rope_groups(*, quick: bool, repeats: int, warmup: int) -> list[Group]:
    """Measure every RoPE case on the suite's shapes; one group per shape, dtype and pass."""
    groups = []
    for shape, dtype in QUICK if quick else FULL:
        tensors = _inputs(shape, dtype)
        info = {"shape": list(shape), "dtype": str(dtype).removeprefix("torch.")}
        label = f"{list(shape)} {info['dtype']}"
        for kind, cases, floor in (
            ("forward", _forward_cases(tensors), FLOOR),
            ("forward+backward", _backward_cases(tensors), BACKWARD_FLOOR),
        ):
            stats = measure(cases, repeats=repeats, warmup=warmup)
            groups.append(
                Group(
                    suite="rope",
                    title=f"RoPE q+k {label} {kind}",
                    stats=stats,
                    floor=floor,
                    speedup_over=(HF_STYLE,),
                    info={**info, "pass": kind},
                    controls={b: c for b, c in CONTROLS.items() if c in stats},
                )
            )
            del cases, stats
    return groups
