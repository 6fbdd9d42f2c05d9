"""Bad input over the whole public surface, generated from its signatures.

The keyword checks are found, not listed: every public constructor and function of
``posenc``, ``posenc.encodings`` and ``posenc.hf`` is inspected, and

* every ``bool`` keyword refuses a truthy string and an integer with a ``TypeError``
  naming the keyword (``causal="no"`` used to mean True);
* every ``dtype`` keyword refuses integer and bool dtypes with a ``TypeError`` naming the
  dtype (``alibi_slopes(8, dtype=torch.int64)`` used to be all zeros: ALiBi as NoPE).

The other required arguments come from ``ARGUMENTS`` by name; a new public callable
with an argument name not in it fails here until a value is added.

Then the hooks of every registered encoding with complex inputs (refused by name), meta
tensors (a result of the right shape, or posenc's ``ValueError``), and mismatched dtypes
(q/k, a layer's weights and its input), and the single gaps: ``register`` of a
non-class, T5 buckets at the int64 extremes, ``rerotate_keys`` from a zero scale.

Shapes: ``B`` batch, ``H`` heads, ``T`` length, ``D`` head_dim, ``C`` d_model.
"""

from __future__ import annotations

import inspect
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
import posenc.encodings
import posenc.hf
from _build import B, C, D, H, apply_hooks, build_encoding, make_inputs

T = 5
_g = torch.Generator().manual_seed(0)
Q = torch.randn(B, H, T, D, generator=_g)
K = torch.randn(B, H, T, D, generator=_g)
POS = torch.arange(T)
INV_FREQ = posenc.rope_inv_freq(D)[0].double()
COS, SIN = posenc.rope_cos_sin(POS, INV_FREQ)


#: A valid value for each required argument name of the public callables.
class Fresh:
    """An argument built anew for each call (one the call changes, such as a model)."""

    def __init__(self, make) -> None:
        self.make = make


def _tiny_llama():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=16, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config)


ARGUMENTS: dict[str, object] = {
    "model": Fresh(_tiny_llama),
    "num_heads": H,
    "head_dim": D,
    "d_model": C,
    "rope_head_dim": D // 2,
    "factor": 2.0,
    "original_max_position_embeddings": 8,
    "x": Q,
    "q": Q,
    "k": K,
    "cos": COS,
    "sin": SIN,
    "positions": POS,
    "inv_freq": INV_FREQ,
    "r1": torch.ones(H),
    "r2": torch.ones(H),
    "relative_position": POS,
    "q_pos": POS,
    "k_pos": POS,
    "old": (INV_FREQ, 1.0),
    "new": (INV_FREQ, 1.0),
    "table": torch.randn(32, H, generator=_g),
    "rotary_dim": D,
    "base": 10000.0,
    "scaling": None,
    "seq_len": T,
    "span": 4,
    "config": {
        "model_type": "llama",
        "hidden_size": C,
        "num_attention_heads": H,
        "max_position_embeddings": 64,
        "rope_theta": 10000.0,
    },
}


def _public() -> dict[str, object]:
    """Every public callable of posenc, posenc.encodings and posenc.hf, by name."""
    found: dict[str, object] = {}
    for module in (posenc, posenc.encodings, posenc.hf):
        for name in module.__all__:
            obj = getattr(module, name)
            if callable(obj) and not isinstance(obj, torch.dtype):
                found.setdefault(name, obj)
    return found


def _keywords(predicate) -> list[tuple[str, str]]:
    """``(callable, parameter)`` for every public parameter that ``predicate`` selects."""
    rows = []
    for name, obj in sorted(_public().items()):
        target = obj.__init__ if inspect.isclass(obj) else obj
        try:
            params = inspect.signature(target).parameters.values()
        except (TypeError, ValueError):
            continue
        rows += [(name, p.name) for p in params if predicate(p)]
    return rows


def _call(name: str, **override: object) -> object:
    """Call the public ``name`` with its required arguments from ``ARGUMENTS``."""
    obj = _public()[name]
    target = obj.__init__ if inspect.isclass(obj) else obj
    kwargs = {}
    for p in inspect.signature(target).parameters.values():
        required = p.default is inspect.Parameter.empty and p.name != "self"
        if required and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name not in override:
            assert p.name in ARGUMENTS, f"add a valid {p.name!r} for {name} to ARGUMENTS"
            value = ARGUMENTS[p.name]
            kwargs[p.name] = value.make() if isinstance(value, Fresh) else value
    return obj(**kwargs, **override)


BOOL_KEYWORDS = _keywords(lambda p: "bool" in str(p.annotation))
DTYPE_KEYWORDS = _keywords(lambda p: p.name == "dtype")


def test_the_surface_has_the_keywords_it_checks():
    assert {"ALiBi", "T5RelativeBias", "apply_rope"} <= {name for name, _ in BOOL_KEYWORDS}
    assert {"alibi_slopes", "sinusoidal_table", "rope_cos_sin"} <= {n for n, _ in DTYPE_KEYWORDS}


@pytest.mark.parametrize("bad", ["no", 1], ids=["str", "int"])
@pytest.mark.parametrize(
    ("name", "keyword"), BOOL_KEYWORDS, ids=[".".join(r) for r in BOOL_KEYWORDS]
)
def test_bool_keywords_refuse_truthy_values(name, keyword, bad):
    _call(name)  # the valid call works
    with pytest.raises(TypeError, match=keyword):
        _call(name, **{keyword: bad})


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool], ids=str)
@pytest.mark.parametrize(
    ("name", "keyword"), DTYPE_KEYWORDS, ids=[".".join(r) for r in DTYPE_KEYWORDS]
)
def test_dtype_keywords_refuse_integer_dtypes(name, keyword, dtype):
    _call(name, **{keyword: torch.float64})
    with pytest.raises(TypeError, match=str(dtype).replace(".", r"\.")):
        _call(name, **{keyword: dtype})


def test_integer_slopes_no_longer_turn_alibi_into_nope():
    with pytest.raises(TypeError, match=r"torch\.int64"):
        posenc.alibi_slopes(8, dtype=torch.int64)


NAMES = posenc.available()


@pytest.mark.parametrize("name", NAMES)
def test_complex_inputs_are_refused_by_name(name):
    enc = build_encoding(name)
    x, q, k, pos = make_inputs(T)
    if not enc.sites:
        pytest.skip(f"{name} has no hooks")
    as_complex = torch.complex64
    with pytest.raises(TypeError, match="complex64"):
        apply_hooks(enc, x.to(as_complex), q.to(as_complex), k.to(as_complex), pos, pos)


def test_complex_input_to_an_attention_layer_is_refused():
    layer = posenc.MultiHeadAttention(C, H, position="alibi")
    with pytest.raises(TypeError, match="complex64"):
        layer(torch.randn(B, T, C).to(torch.complex64))


@pytest.mark.parametrize("name", NAMES)
def test_meta_tensors_give_shapes_or_posencs_error(name):
    """Meta q/k/x (shapes only): the hook returns meta outputs of the real shapes, or a
    ``ValueError`` saying meta; meta positions always raise (positions need values)."""
    enc = build_encoding(name)
    x, q, k, pos = make_inputs(T)
    want = apply_hooks(enc, x, q, k, pos, pos)
    try:
        got = apply_hooks(enc, x.to("meta"), q.to("meta"), k.to("meta"), pos, pos)
    except ValueError as error:
        assert "meta" in str(error)
    else:
        assert {key: v.shape for key, v in got.items()} == {key: v.shape for key, v in want.items()}
    if enc.sites:
        with pytest.raises(ValueError, match="meta"):
            apply_hooks(enc, x, q, k, pos.to("meta"), pos.to("meta"))


@pytest.mark.parametrize("name", [n for n in NAMES if build_encoding(n).sites & posenc.Site.SCORE])
def test_score_hooks_with_q_and_k_of_different_dtypes(name):
    """A bias read from q and k together (CoPE's gates) names the two dtypes; the others
    follow q's dtype, as with matching k."""
    enc = build_encoding(name)
    if name == "cope":
        with pytest.raises(TypeError, match=r"torch\.float64.*torch\.float32"):
            enc.score_bias(Q.double(), K, POS, POS)
        return
    with torch.no_grad():
        mixed = enc.score_bias(Q.double(), K, POS, POS)
        same = enc.score_bias(Q.double(), K.double(), POS, POS)
    torch.testing.assert_close(mixed, same, rtol=0, atol=0)


def test_attention_layer_names_an_input_dtype_its_weights_do_not_have():
    layer = posenc.MultiHeadAttention(C, H, position="rope")
    with pytest.raises(TypeError, match=r"torch\.float64.*torch\.float32"):
        layer(torch.randn(B, T, C, dtype=torch.float64))
    assert layer.double()(torch.randn(B, T, C, dtype=torch.float64)).dtype == torch.float64


@pytest.mark.parametrize("target", [42, "name", lambda: None, torch.nn.Linear], ids=repr)
def test_register_refuses_what_is_not_an_encoding_class(target):
    with pytest.raises(TypeError, match="PositionalEncoding"):
        posenc.register("not_an_encoding", paper="-", description="-")(target)
    assert "not_an_encoding" not in posenc.available()


def test_registry_lookups_refuse_non_string_names():
    with pytest.raises(TypeError, match=r"\[\]"):
        posenc.info([])
    with pytest.raises(TypeError, match="123"):
        posenc.register(123, paper="-", description="-")


def _t5_bucket(r: int, *, bidirectional: bool, num_buckets: int, max_distance: int) -> int:
    """T5's bucket of one relative position on Python integers (Raffel et al. 2020, sec.
    2.1): exact below ``E``, log-spaced up to ``max_distance``, saturated beyond."""
    per_side = num_buckets // 2 if bidirectional else num_buckets
    side = per_side if bidirectional and r > 0 else 0
    n = abs(r) if bidirectional else max(-r, 0)
    exact = per_side // 2
    if n < exact:
        return side + n
    scaled = math.log(n / exact) / math.log(max_distance / exact) * (per_side - exact)
    return side + min(exact + int(scaled), per_side - 1)


INT64 = st.integers(-(2**63), 2**63 - 1)


@settings(max_examples=200, deadline=None)
@given(
    r=st.one_of(INT64, st.sampled_from([-(2**63), 2**63 - 1, -(2**62), 2**62])),
    bidirectional=st.booleans(),
    max_distance=st.integers(17, 4096),
)
def test_t5_buckets_saturate_at_the_int64_extremes(r, bidirectional, max_distance):
    """``|r|`` used to overflow at -(2^63) (a negative bucket); far distances must share
    the last bucket of their side."""
    got = posenc.t5_relative_position_bucket(
        torch.tensor([r]), bidirectional=bidirectional, num_buckets=32, max_distance=max_distance
    )
    far = max(min(r, max_distance), -max_distance)  # saturated: same bucket as the cap
    want = _t5_bucket(far, bidirectional=bidirectional, num_buckets=32, max_distance=max_distance)
    assert int(got) == want
    assert 0 <= int(got) < 32


def test_t5_bias_at_the_int64_minimum_is_the_farthest_bucket():
    enc = posenc.T5RelativeBias(H, bidirectional=True)
    q_pos = torch.tensor([0])
    k_pos = torch.tensor([-(2**63) + 1])  # k - q: far in the past
    bias = enc.score_bias(Q[:, :, :1], K[:, :, :1], q_pos, k_pos)
    table = enc.relative_attention_bias.weight
    torch.testing.assert_close(bias[0, :, 0, 0], table[15], rtol=0, atol=0)


def test_rerotate_keys_from_a_zero_scale_is_refused():
    keys = K[:, :2]
    with pytest.raises(ValueError, match="attention_scale"):
        posenc.rerotate_keys(keys, POS, old=(INV_FREQ, 0.0), new=(INV_FREQ, 1.0))


def test_frequency_arguments_that_are_not_vectors_are_named():
    with pytest.raises(TypeError, match="inv_freq"):
        posenc.rope_cos_sin(POS, [1.0, 0.1])
    with pytest.raises(ValueError, match="inv_freq"):
        posenc.rope_cos_sin(POS, INV_FREQ[None])
    with pytest.raises(TypeError, match="old inv_freq"):
        posenc.rerotate_keys(K, POS, old=([1.0] * (D // 2), 1.0), new=(INV_FREQ, 1.0))
