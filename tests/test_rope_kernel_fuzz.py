"""Fuzzing the compiled CPU RoPE kernel (hypothesis) against the float64 reference.

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head_dim, ``R`` rotary dim.

Each example draws a shape (empty ones and ones spanning several of the kernel's row
blocks included), a dtype, a memory layout for ``x`` (any order of the four dimensions,
gaps between them, a step between features, a storage offset) inside a buffer filled
with a sentinel, the table form (``[T, R/2]``, ``[B, T, R/2]``, ``[1, T, R/2]``), the
pair layout, in place or not, and the thread count. It checks the result against the
float64 reference (a tolerance from the input and compute dtypes' epsilons), against the
PyTorch path bit for bit, and that nothing outside ``x`` (in place) or nothing at all
(out of place) was written. ``scripts/ci_asan_fuzz.sh`` runs this file against a kernel
built with ``-fsanitize=address,undefined`` and more examples
(``POSENC_FUZZ_EXAMPLES``).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from posenc.encodings.rotary import cpu_kernel, rope_op
from posenc.encodings.rotary.apply import apply_rope, apply_rope_
from posenc.encodings.rotary.rope_torch import rotate_torch
from posenc.reference.rope_apply_ref import rope_apply_ref

pytestmark = pytest.mark.skipif(
    cpu_kernel.status() != cpu_kernel.ACTIVE, reason=f"CPU kernel: {cpu_kernel.status()}"
)

DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)
SENTINEL = 7776.0  # exact in every dtype above
EXAMPLES = int(os.environ.get("POSENC_FUZZ_EXAMPLES", "60"))

small = st.tuples(*(st.integers(0, 3) for _ in range(2)), st.integers(0, 9), st.integers(1, 20))
large = st.tuples(
    st.just(1), st.integers(1, 2), st.integers(300, 1200), st.sampled_from([8, 33, 72])
)


@st.composite
def cases(draw):
    batch, heads, length, dim = draw(st.one_of(small, small, small, large))
    half = draw(st.integers(0, dim // 2))
    return {
        "shape": (batch, heads, length, dim),
        "half": half,
        "dtype": draw(st.sampled_from(DTYPES)),
        "order": draw(st.permutations(range(4))),  # outermost first
        "gaps": draw(st.lists(st.integers(0, 3), min_size=4, max_size=4)),
        "step": draw(st.integers(1, 3)),
        "offset": draw(st.integers(0, 5)),
        "table": draw(st.sampled_from(["T", "BT", "1T"])),
        "interleaved": draw(st.booleans()),
        "inplace": draw(st.booleans()),
        "threads": draw(st.integers(1, 3)),
        "scale": draw(st.sampled_from([1.0, 1e-3, 300.0])),
        "seed": draw(st.integers(0, 2**31 - 1)),
    }


def _layout(shape, order, gaps, step, offset, dtype):
    """``x`` as a view into a sentinel-filled buffer; returns ``(x, buffer)``."""
    strides, reach = [0] * 4, 1
    for dim in reversed(order):  # innermost first; each stride steps past the inner ones
        strides[dim] = reach * (step if dim == 3 else 1)
        reach = strides[dim] * max(shape[dim], 1) + gaps[dim]
    span = offset + sum(max(n - 1, 0) * s for n, s in zip(shape, strides, strict=True)) + 1
    buffer = torch.full((span + 7,), SENTINEL, dtype=dtype)
    return torch.as_strided(buffer, shape, strides, offset), buffer


def _tolerance(dtype: torch.dtype, scale: float) -> float:
    """|error| bound: products and sums in the compute dtype, one rounding to ``dtype``."""
    compute = rope_op.compute_dtype(dtype)
    return 2 * (torch.finfo(dtype).eps + 2 * torch.finfo(compute).eps) * scale


@settings(max_examples=EXAMPLES, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_kernel_matches_reference_pytorch_path_and_stays_inside_x(case):
    gen = torch.Generator().manual_seed(case["seed"])
    batch, _, length, _ = shape = case["shape"]
    dtype, half = case["dtype"], case["half"]
    x, buffer = _layout(shape, case["order"], case["gaps"], case["step"], case["offset"], dtype)
    values = (case["scale"] * torch.randn(shape, generator=gen, dtype=torch.float64)).to(dtype)
    x.copy_(values)
    table_shape = {"T": (length,), "BT": (batch, length), "1T": (1, length)}[case["table"]]
    angles = 200 * torch.rand(*table_shape, half, generator=gen, dtype=torch.float64) - 100
    compute = rope_op.compute_dtype(dtype)
    cos, sin = angles.cos().to(compute), angles.sin().to(compute)
    before, inside = buffer.clone(), torch.zeros(buffer.shape, dtype=torch.bool)
    torch.as_strided(inside, shape, x.stride(), x.storage_offset()).fill_(True)

    threads = torch.get_num_threads()
    torch.set_num_threads(case["threads"])
    try:
        if case["inplace"]:
            out = apply_rope_(x, cos, sin, interleaved=case["interleaved"])
            assert out is x
        else:
            out = apply_rope(x, cos, sin, interleaved=case["interleaved"])
    finally:
        torch.set_num_threads(threads)

    assert out.shape == shape and out.dtype == dtype
    if case["inplace"]:
        assert torch.equal(buffer[~inside], before[~inside]), "wrote outside x"
    else:
        assert torch.equal(buffer, before), "modified the input"
    want = rope_apply_ref(
        values.double().numpy(),
        cos.double().numpy(),
        sin.double().numpy(),
        interleaved=case["interleaved"],
    )
    error = np.abs(out.double().numpy() - want)
    assert error.max(initial=0.0) <= _tolerance(dtype, float(np.abs(want).max(initial=1.0)))
    pytorch = torch.empty_like(values)
    tables = rope_op.tables(cos, sin, compute, inverse=False)
    rotate_torch(pytorch, values, *tables, interleaved=case["interleaved"])
    assert torch.equal(out, pytorch), "kernel and PyTorch path differ"
