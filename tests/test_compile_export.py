"""``torch.compile(fullgraph=True)`` and ``torch.export`` of ``MultiHeadAttention``.

Shapes: ``B`` batch, ``T`` length, ``C`` d_model.

* Every registered encoding is captured whole (``fullgraph=True``: a graph break is an
  error) and the captured graph matches eager exactly; three more lengths after the
  first add at most one graph (the dynamic-shape one), not one per length.
* Inductor: ALiBi and RoPE in the default run (compiling is slow on a small CPU), every
  other encoding under ``-m slow``; results match eager to float32 tolerance.
* Training: every registered encoding compiles forward and backward, with and without
  ``fullgraph=True``, in one graph, over two query blocks of the chunked backend; the
  output and the gradients of the input and of every parameter match eager's to float32
  tolerance. Through AOTAutograd (``aot_eager``: the backward that compiled training
  runs, without inductor's code generation) for a representative subset in the default
  run (an offset bias, a learned-table bias, an MLP bias, CoPE, Shaw) and every encoding
  under ``-m slow``, where inductor itself also trains every encoding (``fullgraph``);
  with attention sinks and grouped keys (ALiBi, Shaw) by default; with attention dropout,
  the compiled gradient against central differences of the compiled function.
* ``torch.export`` of an inference layer with a dynamic length: ALiBi (``backend="sdpa"``
  for any length; the chunked backend's loop over query blocks specializes the length
  to at most ``block_size``) and RoPE.

RoPE on CPU tensors is one node in the captured graph, the custom op ``posenc::rope``
(its fake implementation gives the shapes, its autograd formula the backward), so the
captured and exported graphs run the eager kernel and match eager bit for bit; the
in-place ``apply_rope_`` too (the op, then one copy into ``x``), compiled whole and
exported with a dynamic length, tables that are views of ``x`` included.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounter, CompileCounterWithBackend, EagerAndRecordGraphs
from torch._dynamo.utils import counters

import posenc
from _build import B, C, H, attention_positions, build_encoding
from conftest import tolerances
from posenc.encodings.rotary.apply import apply_rope_

LENGTHS = (5, 7, 9, 12)


def _layer(name: str, **kwargs) -> posenc.MultiHeadAttention:
    enc = build_encoding(name, max_len=64)
    torch.manual_seed(0)
    return posenc.MultiHeadAttention(C, H, position=enc, **kwargs).eval()


def _inputs(length: int) -> torch.Tensor:
    return torch.randn(B, length, C, generator=torch.Generator().manual_seed(length))


def _param(name: str, *marks):
    return pytest.param(name, marks=marks, id=name)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


#: Encodings whose attention loops over the keys in Python (PaTH's sweep of Householder
#: transforms): captured whole, but one graph per length (``dynamic=False``).
PER_LENGTH = ("path",)


@pytest.mark.parametrize("name", [_param(n) for n in posenc.available()])
@torch.no_grad()
def test_fullgraph_capture_matches_eager_without_recompiling_per_length(name, monkeypatch):
    layer = _layer(name)
    counter = CompileCounter()  # runs the captured graph as it is: exact comparison
    per_length = name in PER_LENGTH
    dynamic = False if per_length else None
    compiled = torch.compile(layer, backend=counter, fullgraph=True, dynamic=dynamic)
    # What holds, exactly: the captured graph equals eager's per-block path bit for bit.
    # Over consecutive positions eager reads an offset-only bias (ALiBi, T5, KERPLE,
    # Sandwich) from one offset table with the keys in reverse order instead
    # (posenc.attention.blocks.offset_block), which a graph cannot choose without reading
    # the positions on the host: the same float32 sums in another order, equal to the
    # per-block result up to float32 rounding and nothing more.
    offset_only = posenc.info(name).cls.offset_only
    for length in LENGTHS:
        x, pos = _inputs(length), attention_positions(layer.position, None, length)
        got = compiled(x, pos)
        with monkeypatch.context() as patched:
            patched.setattr(posenc.attention.backends, "offset_table", lambda *args: None)
            per_block = layer(x, pos)
        torch.testing.assert_close(got, per_block, rtol=0, atol=0)
        if offset_only:
            torch.testing.assert_close(got, layer(x, pos), **tolerances(torch.float32))
    most = len(LENGTHS) if per_length else 2
    assert counter.frame_count <= most, f"{counter.frame_count} graphs for {len(LENGTHS)} lengths"


INDUCTOR = [_param("alibi"), _param("rope")] + [
    _param(n, pytest.mark.slow) for n in posenc.available() if n not in ("alibi", "rope")
]


@pytest.mark.parametrize("name", INDUCTOR)
@torch.no_grad()
def test_inductor_matches_eager(name):
    layer = _layer(name)
    per_length = name in PER_LENGTH
    compiled = torch.compile(layer, fullgraph=True, dynamic=False if per_length else None)
    for length in LENGTHS[:3]:
        x, pos = _inputs(length), attention_positions(layer.position, None, length)
        torch.testing.assert_close(
            compiled(x, pos), layer(x, pos), **tolerances(torch.float32, ops=64)
        )
    assert counters["stats"]["unique_graphs"] <= (3 if per_length else 2)


@pytest.mark.parametrize(
    ("name", "backend", "longest"),
    [
        pytest.param("alibi", "sdpa", 4096, id="alibi-sdpa"),
        pytest.param("alibi", "auto", posenc.MultiHeadAttention(C, H).block_size, id="alibi"),
        pytest.param("rope", "auto", 4096, id="rope"),
    ],
)
@torch.no_grad()
def test_export_with_a_dynamic_length(name, backend, longest):
    layer = _layer(name, backend=backend)
    length = torch.export.Dim("T", min=2, max=longest)
    program = torch.export.export(layer, (_inputs(9),), dynamic_shapes=({1: length},))
    exported = program.module()
    for n in (5, 9, 33):
        x = _inputs(n)
        torch.testing.assert_close(exported(x), layer(x), **tolerances(torch.float32, ops=64))


@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_is_one_custom_op_node_forward_and_backward(interleaved):
    """``MultiHeadAttention`` with RoPE compiles whole with ``posenc::rope`` in the graph,
    equal to eager bit for bit, gradients included."""
    rope = posenc.RotaryEmbedding(C // H, interleaved=interleaved)
    torch.manual_seed(0)
    layer = posenc.MultiHeadAttention(C, H, position=rope)
    graphs = EagerAndRecordGraphs()
    compiled = torch.compile(layer, backend=graphs, fullgraph=True)
    x = _inputs(7).requires_grad_(True)
    out = compiled(x)
    (grad,) = torch.autograd.grad(out.square().sum(), x)
    want = layer(x)
    (want_grad,) = torch.autograd.grad(want.square().sum(), x)
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    torch.testing.assert_close(grad, want_grad, rtol=0, atol=0)
    code = "".join(graph.code for graph in graphs.graphs)
    assert len(graphs.graphs) == 1 and code.count("torch.ops.posenc.rope") == 2  # q and k


def _rope_inputs(length: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x [B, H, T, D]`` and the ``cos``/``sin`` ``[T, D/2 - 1]`` of a partial rotation."""
    x = torch.randn(B, H, length, C // H, generator=torch.Generator().manual_seed(length))
    angles = torch.rand(length, C // H // 2 - 1, generator=torch.Generator().manual_seed(1))
    return x, angles.cos(), angles.sin()


class _RopeInPlace(torch.nn.Module):
    def forward(self, x, cos, sin):
        return apply_rope_(x.clone(), cos, sin)


def _rope_nodes(code: str) -> int:
    return code.count("torch.ops.posenc.rope")


def test_inplace_rope_compiles_whole_to_the_custom_op():
    x, cos, sin = _rope_inputs(7)
    graphs = EagerAndRecordGraphs()
    rotated = x.clone()
    got = torch.compile(apply_rope_, backend=graphs, fullgraph=True)(rotated, cos, sin)
    assert got is rotated  # in place, as eagerly
    torch.testing.assert_close(rotated, posenc.apply_rope(x, cos, sin), rtol=0, atol=0)
    assert len(graphs.graphs) == 1 and _rope_nodes(graphs.graphs[0].code) == 1


def test_inplace_rope_compiled_reads_tables_that_are_views_of_x_as_passed():
    """Eagerly the tables that share ``x``'s memory are copied before the kernel writes
    ``x``; the graph rotates out of place and then writes ``x``: the same result."""

    def rotate_by_own_rows(x):
        return apply_rope_(x, x[0, 0, :, 1:4], x[0, 1, :, 2:5])

    x, _, _ = _rope_inputs(7)
    compiled = torch.compile(rotate_by_own_rows, backend=CompileCounter(), fullgraph=True)
    torch.testing.assert_close(compiled(x.clone()), rotate_by_own_rows(x.clone()), rtol=0, atol=0)


def test_inplace_rope_exports_with_a_dynamic_length():
    length = torch.export.Dim("T", min=2, max=4096)
    dims = ({2: length}, {0: length}, {0: length})
    program = torch.export.export(_RopeInPlace(), _rope_inputs(9), dynamic_shapes=dims)
    assert _rope_nodes(program.graph_module.code) == 1
    for n in (3, 9, 33):
        x, cos, sin = _rope_inputs(n)
        want = posenc.apply_rope(x, cos, sin)
        torch.testing.assert_close(program.module()(x, cos, sin), want, rtol=0, atol=0)


#: Compiled training in the default run: an offset bias (ALiBi), a learned-table bias
#: (T5), an MLP bias (FIRE), the contextual CoPE and Shaw's key and value terms.
TRAIN_FAST = ("alibi", "t5", "fire", "cope", "shaw")


#: Every encoding with and without ``fullgraph``; those not in ``TRAIN_FAST`` are slow.
TRAINING = [
    pytest.param(
        name,
        fullgraph,
        marks=() if name in TRAIN_FAST else (pytest.mark.slow,),
        id=f"{name}-{'fullgraph' if fullgraph else 'breaks-allowed'}",
    )
    for name in posenc.available()
    for fullgraph in (True, False)
]


def _loss_and_grads(layer, run, x, pos) -> tuple[torch.Tensor, list]:
    """``run(x, pos)`` and the gradients of a loss on it for ``x`` and every parameter
    (None for one the loss does not reach)."""
    wrt = [x, *(p for p in layer.parameters() if p.requires_grad)]
    out = run(x, pos)
    return out, list(torch.autograd.grad(out.square().sum(), wrt, allow_unused=True))


def _check_training(name: str, backend, fullgraph: bool, **kwargs) -> None:
    """Compiled forward and backward equal eager's over two query blocks (``T = 7``,
    ``block_size = 4``: the chunked backend's loop, whose eager backward recomputes
    each block); ``kwargs`` go to ``MultiHeadAttention``."""
    layer = _layer(name, block_size=4, **kwargs).train()
    if layer.sinks is not None:  # off their zero init, so that they matter
        with torch.no_grad():
            layer.sinks.add_(torch.randn(H, generator=torch.Generator().manual_seed(2)))
    x = _inputs(7).requires_grad_(True)
    pos = attention_positions(layer.position, None, 7)
    compiled = torch.compile(layer, backend=backend, fullgraph=fullgraph)
    got, got_grads = _loss_and_grads(layer, compiled, x, pos)
    want, want_grads = _loss_and_grads(layer, layer, x, pos)
    tol = tolerances(torch.float32, ops=64)
    torch.testing.assert_close(got, want, **tol)
    assert [g is None for g in got_grads] == [w is None for w in want_grads]
    for got_grad, want_grad in zip(got_grads, want_grads, strict=True):
        if want_grad is not None:
            torch.testing.assert_close(got_grad, want_grad, **tol)


@pytest.mark.parametrize(("name", "fullgraph"), TRAINING)
def test_compiled_training_matches_eager(name, fullgraph):
    counter = CompileCounterWithBackend("aot_eager")
    _check_training(name, counter, fullgraph)
    assert counter.frame_count == 1, f"{counter.frame_count} graphs: a graph break"


@pytest.mark.parametrize("name", ["alibi", "shaw"])
def test_compiled_training_with_sinks_and_grouped_keys_matches_eager(name):
    """The sink logits' gradient too; ALiBi's blocks then take the sink key, not the
    offset table."""
    _check_training(name, "aot_eager", True, sinks=True, num_kv_heads=H // 2)


@pytest.mark.parametrize("name", ["t5", "shaw"])
def test_compiled_training_with_dropout_differentiates_the_forward_that_ran(name):
    """With attention dropout the compiled masks are not eager's, so the compiled gradient
    is checked against central differences of the compiled function itself (float64, the
    same seed for every call): a backward that recomputed a block with another mask
    would differ by O(1)."""
    layer = _layer(name, block_size=4, dropout=0.5).train().double()
    gen = torch.Generator().manual_seed(3)
    x, weights, direction = (
        torch.randn(B, 7, C, generator=gen, dtype=torch.float64) for _ in "xwd"
    )
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)

    def loss(x):
        torch.manual_seed(5)
        return (compiled(x) * weights).sum()

    x.requires_grad_(True)
    (grad,) = torch.autograd.grad(loss(x), x)
    step = torch.finfo(torch.float64).eps ** (1 / 3)  # central differences' best step
    with torch.no_grad():
        slope = (loss(x + step * direction) - loss(x - step * direction)) / (2 * step)
    rtol = torch.finfo(torch.float64).eps ** 0.5
    torch.testing.assert_close((grad * direction).sum(), slope, rtol=rtol, atol=0)


@pytest.mark.slow
@pytest.mark.parametrize("name", posenc.available())
def test_inductor_training_matches_eager(name):
    """Inductor's code for the graphs above (without ``fullgraph`` the graph is the same
    one: the test above finds no graph break)."""
    _check_training(name, "inductor", fullgraph=True)
