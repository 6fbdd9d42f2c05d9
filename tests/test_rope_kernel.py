"""The compiled CPU kernel of apply_rope: which path runs and why, a failed build, and
second derivatives of RoPE and xPos through the modules and attention. The kernel's
numerics are checked against the float64 reference in test_rope_apply.py."""

from __future__ import annotations

import pytest
import torch

import posenc
from posenc.encodings.rotary import cpu_kernel

B, H, T, D = 1, 2, 3, 4


@pytest.fixture
def fresh_status():
    """Forget the loaded kernel before and after the test (its status is cached)."""
    cpu_kernel._load.cache_clear()
    yield
    cpu_kernel._load.cache_clear()


@pytest.mark.parametrize("interleaved", [False, True])
def test_kernel_gives_strided_views_their_contiguous_result(gen, interleaved):
    """Any strides take the kernel, bit for bit the result of a contiguous copy."""
    if cpu_kernel.status() != "compiled C++ kernel":
        pytest.skip(f"CPU kernel: {cpu_kernel.status()}")
    x = torch.randn(B, H, T, 2 * D, generator=gen)[..., ::2]  # every other feature
    cos, sin = torch.rand(T, 1, generator=gen), torch.rand(T, 1, generator=gen)  # R = 2 < D
    out = torch.full_like(x, float("nan"))
    assert cpu_kernel.rotate(out, x, cos, sin, interleaved=interleaved)
    dense = torch.full_like(x.contiguous(), float("nan"))
    assert cpu_kernel.rotate(dense, x.contiguous(), cos, sin, interleaved=interleaved)
    assert torch.equal(out, dense) and not dense.isnan().any()
    in_place = x.clone()
    assert cpu_kernel.rotate(in_place, in_place, cos, sin, interleaved=interleaved)
    assert torch.equal(in_place, dense)


def test_switched_off_by_the_environment(monkeypatch, fresh_status, gen):
    monkeypatch.setenv(cpu_kernel.ENV_SWITCH, "0")
    assert cpu_kernel.status() == f"PyTorch fallback (disabled by {cpu_kernel.ENV_SWITCH}=0)"
    x = torch.randn(B, H, T, D, generator=gen)
    cos = torch.rand(T, D // 2, generator=gen)
    assert not cpu_kernel.rotate(torch.empty_like(x), x, cos, cos, interleaved=False)


def test_missing_library_is_reported(monkeypatch, fresh_status, tmp_path):
    monkeypatch.setattr(cpu_kernel, "library_path", lambda: tmp_path / "absent.so")
    assert cpu_kernel.status().startswith("PyTorch fallback (not built")


def test_failed_build_raises_and_leaves_nothing(monkeypatch, tmp_path):
    monkeypatch.setattr(cpu_kernel, "library_path", lambda: tmp_path / "kernel.so")
    with pytest.raises(RuntimeError, match="no-such-compiler"):
        cpu_kernel.build(compiler="no-such-compiler")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["rope", "xpos"])
def test_module_second_derivatives(gen, name):
    """gradgradcheck of the RoPE/xPos rotation of q and k, in float64."""
    module = posenc.build(name, head_dim=D).double()
    q, k = (
        torch.randn(B, H, T, D, generator=gen, dtype=torch.float64, requires_grad=True)
        for _ in range(2)
    )
    assert torch.autograd.gradgradcheck(lambda q, k: module(q, k), (q, k))


@pytest.mark.parametrize("backend", ["eager", "chunked"])
@pytest.mark.parametrize("name", ["rope", "xpos"])
def test_attention_second_derivatives(gen, name, backend):
    """Double backward through attention with RoPE/xPos (the backends that have one;
    torch's fused SDPA kernels have no double backward)."""
    torch.manual_seed(0)
    layer = posenc.MultiHeadAttention(4, 1, position=name, backend=backend).double()
    x = torch.randn(1, 3, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(layer, (x,))
