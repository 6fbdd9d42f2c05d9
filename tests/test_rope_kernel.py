"""The compiled CPU kernel of apply_rope: how it is built, found, verified and refused,
the operator it registers, the custom op that compiled graphs call, and second
derivatives of RoPE and xPos through the modules and attention. The kernel's numerics
are checked against the float64 reference in test_rope_apply.py and
test_rope_kernel_fuzz.py.

Builds and broken libraries are tried in child processes with their own cache
directory (``POSENC_CACHE_DIR``): a library loaded into this process stays loaded."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys

import pytest
import torch

import posenc
from posenc.encodings.rotary import cpu_kernel, rope_op
from posenc.encodings.rotary.rope_torch import rotate_torch
from posenc.reference.rope_apply_ref import rope_apply_ref

B, H, T, D = 1, 2, 3, 4
KERNEL = cpu_kernel.status() == cpu_kernel.ACTIVE
needs_kernel = pytest.mark.skipif(not KERNEL, reason=f"CPU kernel: {cpu_kernel.status()}")

# A child that prints the path, then checks the rotation against the float64 reference.
CHILD = """
import numpy as np, torch, posenc
from posenc.encodings.rotary import cpu_kernel
from posenc.reference.rope_apply_ref import rope_apply_ref
print(cpu_kernel.status())
x, angles = torch.randn(2, 3, 5, 8, dtype=torch.float64), torch.rand(5, 4, dtype=torch.float64)
cos, sin = angles.cos(), angles.sin()
want = rope_apply_ref(x.numpy(), cos.numpy(), sin.numpy())
assert np.allclose(posenc.apply_rope(x, cos, sin).numpy(), want, rtol=1e-14, atol=1e-14)
"""


def _recorded(library) -> bool:
    """The library is the file its build recorded (its SHA-256 in ``<library>.sha256``)."""
    record = library.with_name(library.name + ".sha256")
    return record.read_text() == hashlib.sha256(library.read_bytes()).hexdigest()


def _child(cache, **env) -> subprocess.CompletedProcess:
    environ = {**os.environ, cpu_kernel.ENV_CACHE: str(cache), **env}
    environ.pop(cpu_kernel.ENV_SWITCH, None)
    return subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, env=environ, check=False
    )


@needs_kernel
@pytest.mark.parametrize("interleaved", [False, True])
def test_kernel_gives_strided_views_their_contiguous_result(gen, interleaved):
    """Any strides take the kernel, bit for bit the result of a contiguous copy."""
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


@needs_kernel
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dim", [64, 40])  # 32 pairs: vectors of 16 only; 20: one and a rest
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_rows_give_the_pytorch_bits_for_every_pattern(gen, interleaved, dim, dtype):
    """Random 16-bit patterns (NaNs of any sign and payload, infinities, zeros,
    subnormals) and rows scaled so that results round to subnormals or overflow: the
    kernel, in place and not, writes the PyTorch path's bits, NaNs included (the
    canonical NaN on both). Where the CPU has AVX-512, its rows convert sixteen values at
    once (bfloat16 with AVX512-BF16, lane by lane for a NaN or subnormal)."""
    shape = (2, 3, 40, dim)
    patterns = torch.randint(-(2**15), 2**15, shape, generator=gen, dtype=torch.int16)
    x = patterns.view(dtype).clone()
    normal, info = torch.randn(shape, generator=gen), torch.finfo(dtype)
    x[0, 1] = (normal[0, 1] * info.tiny).to(dtype)  # products land on subnormals
    x[1, 2] = (normal[1, 2] * info.max).to(dtype)  # sums overflow to infinity
    angles = 6.3 * torch.rand(shape[2], dim // 2, generator=gen)
    cos, sin = angles.cos(), angles.sin()
    want = torch.empty_like(x)
    rotate_torch(want, x, *rope_op.tables(cos, sin, torch.float32, False), interleaved=interleaved)
    out = torch.empty_like(x)
    assert cpu_kernel.rotate(out, x, cos, sin, interleaved=interleaved)
    in_place = x.clone()
    assert cpu_kernel.rotate(in_place, in_place, cos, sin, interleaved=interleaved)
    for got in (out, in_place):
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    subnormal = (want != 0) & (want.abs() < info.tiny)
    assert want.isnan().any() and want.isinf().any() and subnormal.any()


@needs_kernel
def test_the_library_lives_in_the_cache_with_its_checksum():
    library = cpu_kernel.library_path()
    assert library.is_relative_to(cpu_kernel.cache_directory())
    assert _recorded(library)


def test_a_build_for_one_cpu_is_never_loaded_on_another(monkeypatch):
    """The build is native to its CPU (x86-64), so the CPU is part of its folder's hash."""
    here = cpu_kernel.build_directory()
    assert cpu_kernel._cpu_identity()
    monkeypatch.setattr(cpu_kernel, "_cpu_identity", lambda: "another CPU|sse2")
    assert cpu_kernel.build_directory() != here


def test_switched_off_by_the_environment(monkeypatch, gen):
    monkeypatch.setenv(cpu_kernel.ENV_SWITCH, "0")
    cpu_kernel._load.cache_clear()
    try:
        assert cpu_kernel.status() == f"PyTorch fallback (disabled by {cpu_kernel.ENV_SWITCH}=0)"
        x = torch.randn(B, H, T, D, generator=gen)
        cos = torch.rand(T, D // 2, generator=gen)
        assert not cpu_kernel.rotate(torch.empty_like(x), x, cos, cos, interleaved=False)
    finally:
        monkeypatch.undo()
        cpu_kernel._load.cache_clear()


def test_a_missing_source_is_an_error_that_names_it(monkeypatch, tmp_path):
    monkeypatch.setattr(cpu_kernel, "SOURCE", tmp_path / "rope_cpu.cpp")
    with pytest.raises(RuntimeError, match=r"rope_cpu\.cpp is missing"):
        cpu_kernel.build()


@pytest.mark.parametrize(
    ("compiler", "reason"),
    [("no-such-compiler", "no C++ compiler: 'no-such-compiler' not found"), ("false", "")],
)
def test_without_a_working_compiler_the_pytorch_path_runs(tmp_path, compiler, reason):
    """No compiler, or one that fails: the fallback, named with its reason; nothing is
    left that a later process could load."""
    done = _child(tmp_path, CXX=compiler)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"PyTorch fallback ({reason}")
    assert not list(tmp_path.rglob("*.so.sha256"))


@needs_kernel
@pytest.mark.parametrize("compiler", ["no-such-compiler", None])
def test_a_truncated_library_is_never_loaded(tmp_path, compiler):
    """A cut library (an interrupted copy) fails its checksum: rebuilt where a compiler
    is, else the fallback says why; never a SIGBUS."""
    built = cpu_kernel.build_directory()
    copy = tmp_path / built.relative_to(cpu_kernel.cache_directory())
    shutil.copytree(built, copy)
    library = copy / cpu_kernel.library_path().name
    library.write_bytes(library.read_bytes()[:20000])
    done = _child(tmp_path, **({"CXX": compiler} if compiler else {}))
    assert done.returncode == 0, done.stderr
    if compiler:
        assert done.stdout.startswith("PyTorch fallback (")
        assert "failed its checksum" in done.stdout
    else:
        assert done.stdout.startswith(cpu_kernel.ACTIVE)
        # rebuilt whole: the library matches the checksum its build recorded (builds from
        # other environments or folders need not be byte-identical, so no cross-check)
        assert _recorded(library) and library.stat().st_size > 20000


@pytest.mark.slow
@needs_kernel
def test_processes_starting_together_build_once(tmp_path):
    """Two first uses at once on an empty cache: one builds under the lock, the other
    waits and loads the recorded library; both run the kernel."""
    environ = {**os.environ, cpu_kernel.ENV_CACHE: str(tmp_path)}
    environ.pop(cpu_kernel.ENV_SWITCH, None)
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True, env=environ
        )
        for _ in range(2)
    ]
    outputs = [child.communicate()[0] for child in children]
    assert [child.returncode for child in children] == [0, 0]
    assert all(out.startswith(cpu_kernel.ACTIVE) for out in outputs), outputs
    assert len(list(tmp_path.rglob("*.so.sha256"))) == 1


@needs_kernel
def test_the_operator_guards_memory_whoever_calls_it(gen):
    """``posenc_cpu::rope_into`` reads lazy negation and zero tensors as their values
    (the dispatcher resolves them), refuses overlapping or misfitting memory, and other
    devices."""
    x = torch.randn(B, H, T, D, generator=gen)
    cos = torch.rand(1, T, D // 2, generator=gen)
    op = torch.ops.posenc_cpu.rope_into
    negated, want = torch.empty_like(x), torch.empty_like(x)
    op(torch._neg_view(x), negated, cos, cos, False)
    op(-x, want, cos, cos, False)
    assert torch.equal(negated, want)
    zero = torch.full_like(x, float("nan"))
    op(torch._efficientzerotensor(x.shape), zero, cos, cos, False)
    assert torch.equal(zero, torch.zeros_like(x))
    with pytest.raises(RuntimeError, match="single memory location"):
        op(x, x[:, :1].expand_as(x), cos, cos, False)
    out = torch.empty_like(x)
    with pytest.raises(RuntimeError, match="single memory location"):
        op(x, out, out.view(-1)[: T * D // 2].view(1, T, D // 2), cos, False)
    short = cos[:, :2].contiguous()  # T - 1 positions
    with pytest.raises(RuntimeError, match="do not fit"):
        op(x, torch.empty_like(x), short, short, False)
    with pytest.raises(NotImplementedError):
        op(x.to("meta"), torch.empty_like(x, device="meta"), cos.to("meta"), cos, False)


def test_the_custom_op_passes_torch_library_opcheck(gen):
    """Schema, fake implementation (shapes and strides), autograd registration."""
    x = torch.randn(B, H, T, D, generator=gen, requires_grad=True)
    angles = torch.rand(B, T, D // 2, generator=gen)
    torch.library.opcheck(rope_op.rope, (x, angles.cos(), angles.sin(), True, False))


def test_the_custom_op_matches_the_reference_and_inverts(gen):
    x = torch.randn(B, H, T, D, generator=gen, dtype=torch.float64)
    angles = torch.rand(T, D // 2, generator=gen, dtype=torch.float64)
    got = rope_op.rope(x, angles.cos(), angles.sin(), False, False)
    want = rope_apply_ref(x.numpy(), angles.cos().numpy(), angles.sin().numpy())
    torch.testing.assert_close(got, torch.from_numpy(want), rtol=1e-14, atol=1e-14)
    back = rope_op.rope(got, angles.cos(), angles.sin(), False, True)
    torch.testing.assert_close(back, x, rtol=1e-14, atol=1e-14)


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
