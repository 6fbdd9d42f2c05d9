"""The operator ``posenc::rope`` under ``torch.func`` transforms, eagerly and in compiled
graphs: its vmap rule (one call for the whole batch, each row rotated as it would be
alone, every placement of the vmapped dimension), its refusal of forward-mode AD (which
torch.library cannot give it), and ``apply_rope`` compiled under ``vmap``, ``jvp``,
forward-mode AD, ``grad`` and ``vmap(grad)``, compared with the float64 reference."""

from __future__ import annotations

import pytest
import torch
import torch.autograd.forward_ad as forward_ad

from conftest import tolerances
from posenc.encodings.rotary import cpu_kernel, rope_op
from posenc.encodings.rotary.apply import apply_rope
from posenc.reference.rope_apply_ref import rope_apply_ref

N, B, H, T, D = 3, 2, 2, 5, 8


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _angles(gen, *lead):
    return 20 * torch.rand(*lead, T, D // 2, generator=gen, dtype=torch.float64) - 10


def _reference(x, cos, sin, interleaved=False, inverse=False):
    """float64 rotation of ``x [B, H, T, D]`` (``-theta`` when ``inverse``)."""
    sin = -sin if inverse else sin
    want = rope_apply_ref(
        x.double().numpy(), cos.double().numpy(), sin.double().numpy(), interleaved=interleaved
    )
    return torch.from_numpy(want)


def _op(interleaved=False, inverse=False):
    return lambda x, cos, sin: rope_op.rope(x, cos, sin, interleaved, inverse)


#: (x's vmapped dim, the tables' vmapped dim, the tables' unbatched shape before [T, R/2])
PLACEMENTS = [
    pytest.param(0, None, (), id="x-only"),
    pytest.param(2, None, (B,), id="x-dim2-per-row-tables"),
    pytest.param(0, 0, (), id="both"),
    pytest.param(None, 0, (1,), id="tables-only"),
    pytest.param(3, 1, (B,), id="x-dim3-tables-dim1"),
]


@pytest.mark.parametrize(("x_dim", "table_dim", "table_lead"), PLACEMENTS)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("inverse", [False, True])
def test_vmap_rule_equals_the_op_row_by_row(
    gen, x_dim, table_dim, table_lead, interleaved, inverse
):
    x = torch.randn(N, B, H, T, D, generator=gen)
    angles = _angles(gen, N, *table_lead)
    cos, sin = angles.cos().float(), angles.sin().float()
    # row i of the batch: x[i] (x[0] for every row when x is not vmapped), table i likewise
    rows = [(x[i if x_dim is not None else 0], i if table_dim is not None else 0) for i in range(N)]
    op = _op(interleaved, inverse)
    want = torch.stack([op(r, cos[j], sin[j]) for r, j in rows])
    args = (
        x[0] if x_dim is None else x.movedim(0, x_dim),
        cos[0] if table_dim is None else cos.movedim(0, table_dim),
        sin[0] if table_dim is None else sin.movedim(0, table_dim),
    )
    got = torch.func.vmap(op, in_dims=(x_dim, table_dim, table_dim))(*args)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    ref = torch.stack([_reference(r, cos[j], sin[j], interleaved, inverse) for r, j in rows])
    torch.testing.assert_close(got.double(), ref, **tolerances(torch.float32))


def test_vmap_rule_rotates_the_batch_in_one_call(gen, monkeypatch):
    """The rule folds the vmapped dimension into B (torch's fallback would loop N times)."""
    if cpu_kernel.status() != cpu_kernel.ACTIVE:
        pytest.skip(f"CPU kernel: {cpu_kernel.status()}")
    calls = []
    rotate = cpu_kernel.rotate
    monkeypatch.setattr(cpu_kernel, "rotate", lambda *a, **k: calls.append(1) or rotate(*a, **k))
    angles = _angles(gen)
    x = torch.randn(N, B, H, T, D, generator=gen)
    torch.func.vmap(_op(), in_dims=(0, None, None))(x, angles.cos().float(), angles.sin().float())
    assert len(calls) == 1


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_vmap_of_the_op_compiles_whole(gen, backend):
    x = torch.randn(N, B, H, T, D, generator=gen)
    angles = _angles(gen, N)
    cos, sin = angles.cos().float(), angles.sin().float()
    batched = torch.func.vmap(_op(interleaved=True))
    compiled = torch.compile(batched, backend=backend, fullgraph=True)
    torch.testing.assert_close(compiled(x, cos, sin), batched(x, cos, sin), rtol=0, atol=0)


def test_exported_graph_runs_under_vmap(gen):
    """An exported rotation is the op node; vmapping the exported module uses the rule."""
    angles = _angles(gen)
    cos, sin = angles.cos().float(), angles.sin().float()

    class Rotate(torch.nn.Module):
        def forward(self, x):
            return apply_rope(x, cos, sin)

    x = torch.randn(N, B, H, T, D, generator=gen)
    module = torch.export.export(Rotate(), (x[0],)).module()
    assert "torch.ops.posenc.rope" in module.code
    got = torch.func.vmap(module)(x)
    torch.testing.assert_close(
        got, torch.stack([apply_rope(r, cos, sin) for r in x]), rtol=0, atol=0
    )


def test_the_op_refuses_forward_mode_ad_instead_of_dropping_the_tangent(gen):
    angles = _angles(gen)
    x, t = torch.randn(2, B, H, T, D, generator=gen)
    with pytest.raises(RuntimeError, match="posenc::rope has no forward-mode AD formula"):
        torch.func.jvp(lambda v: _op()(v, angles.cos().float(), angles.sin().float()), (x,), (t,))


def _forward_ad_tangent(f, x, t):
    with forward_ad.dual_level():
        return forward_ad.unpack_dual(f(forward_ad.make_dual(x, t))).tangent


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_apply_rope_under_transforms_matches_the_reference(gen, backend):
    """Compiled, the rotation reaches the op only where no transform would need it to
    carry tangents or gradients; every transform's result equals the float64 one."""
    angles = _angles(gen)
    cos, sin = angles.cos().float(), angles.sin().float()
    # separate tensors: dynamo cannot trace forward-mode AD on a view of a larger one
    x, w = (torch.randn(N, B, H, T, D, generator=gen) for _ in range(2))
    x0, w0 = x[0].clone(), w[0].clone()

    def rotate(v):
        return apply_rope(v, cos, sin)

    def loss(v, u):
        return (rotate(v) * u).sum()

    cases = {
        "vmap": (torch.func.vmap(rotate), (x,), [_reference(r, cos, sin) for r in x]),
        "jvp": (
            lambda v, u: torch.func.jvp(rotate, (v,), (u,))[1],
            (x0, w0),
            [_reference(w0, cos, sin)],
        ),
        "forward_ad": (
            lambda v, u: _forward_ad_tangent(rotate, v, u),
            (x0, w0),
            [_reference(w0, cos, sin)],
        ),
        "grad": (torch.func.grad(loss), (x0, w0), [_reference(w0, cos, sin, inverse=True)]),
        "vmap_grad": (
            torch.func.vmap(torch.func.grad(loss)),
            (x, w),
            [_reference(u, cos, sin, inverse=True) for u in w],
        ),
    }
    for name, (f, args, want) in cases.items():
        got = torch.compile(f, backend=backend, fullgraph=True)(*args)
        want = torch.stack(want) if len(want) > 1 else want[0]
        torch.testing.assert_close(got.double(), want, **tolerances(torch.float32), msg=name)
