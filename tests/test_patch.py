"""posenc.hf.patch on tiny random transformers models, saved and loaded back (nothing
downloaded): the original logits and greedy tokens, scalings equal to the model built with
them in its config, the two length policies, exact unpatch, and bad input."""

from __future__ import annotations

import threading

import pytest
import torch

transformers = pytest.importorskip("transformers")

from posenc.hf.patch import patch, unpatch  # noqa: E402

VOCAB, PROMPT, NEW = 61, 6, 12

FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "gemma3_text": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        {
            "layer_types": ["sliding_attention", "full_attention"],
            "sliding_window": 5,
            "head_dim": 8,
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
            },
        },
    ),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"partial_rotary_factor": 0.75, "pad_token_id": 0}),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", {"rotary_pct": 0.5}),
    "cohere": ("CohereConfig", "CohereForCausalLM", {}),
    "glm": ("GlmConfig", "GlmForCausalLM", {"partial_rotary_factor": 0.5, "head_dim": 8}),
    # HunYuan's fixed NTK-alpha base, written as "dynamic" with an alpha
    "hunyuan_v1_dense": (
        "HunYuanDenseV1Config",
        "HunYuanDenseV1ForCausalLM",
        {
            "head_dim": 8,
            "rope_parameters": {"rope_type": "dynamic", "alpha": 1000.0, "factor": 1.0},
        },
    ),
}


def _config(family: str, **extra):
    config_cls, _, options = FAMILIES[family]
    base = {
        "vocab_size": VOCAB,
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
        "initializer_range": 0.5,  # spread-out logits: greedy ties would not test anything
        "eos_token_id": None,
        "bos_token_id": None,
        "pad_token_id": None,
    }
    return getattr(transformers, config_cls)(**{**base, **options, **extra})


def _saved(tmp_path_factory, family: str, **extra):
    """A tiny random model of ``family`` written by ``save_pretrained`` and loaded back."""
    model_cls = getattr(transformers, FAMILIES[family][1])
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp(family)
    model_cls(_config(family, **extra)).save_pretrained(folder)
    return model_cls, folder


def _load(model_cls, folder, **config_changes):
    config = transformers.AutoConfig.from_pretrained(folder, **config_changes)
    return model_cls.from_pretrained(folder, config=config, dtype=torch.float32).eval()


def _close(actual, expected, length: int, layers: int = 2) -> None:
    """Logits agree to what float32 angles allow: transformers forms ``position * inv_freq``
    in float32 (error up to ``length`` ulps of the angle), posenc in float64."""
    eps = torch.finfo(torch.float32).eps
    scale = expected.abs().max().item()
    tol = 16 * (length + layers) * eps * scale
    torch.testing.assert_close(actual, expected, rtol=0.0, atol=tol)


def _greedy(model, ids):
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=NEW,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=0,
        )
    return out.sequences, torch.stack(out.logits, dim=1)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_patched_model_gives_the_original_logits_and_tokens(family, tmp_path_factory):
    model_cls, folder = _saved(tmp_path_factory, family)
    model = _load(model_cls, folder)
    ids = torch.randint(0, VOCAB, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(ids).logits
    tokens, step_logits = _greedy(model, ids[:, :PROMPT])
    rotary = model.base_model.rotary_emb
    patch(model)
    assert model.base_model.rotary_emb is not rotary
    with torch.no_grad():
        _close(model(ids).logits, expected, ids.shape[1])
    patched_tokens, patched_logits = _greedy(model, ids[:, :PROMPT])
    torch.testing.assert_close(patched_tokens, tokens, rtol=0, atol=0)
    _close(patched_logits, step_logits, PROMPT + NEW)
    unpatch(model)
    assert model.base_model.rotary_emb is rotary
    assert all("forward" not in m.__dict__ for m in model.modules())
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, expected, rtol=0, atol=0)


def _swap_before_the_last_layer(model, swap, when: int):
    """A pre-hook on the model's last decoder layer that calls ``swap(model)`` on its
    ``when``-th call: that forward's tables were made before the swap, its last layer's
    rotation after it (what another thread's ``patch``/``unpatch`` can do to a forward)."""
    layers = [m for name, m in model.named_modules() if name.endswith("layers.1")]
    calls = []

    def hook(module, args):
        calls.append(len(calls))
        if len(calls) == when:
            swap(model)

    return layers[0].register_forward_pre_hook(hook)


@pytest.mark.parametrize("swap", ["patch", "unpatch"])
@pytest.mark.parametrize("family", ["llama", "cohere", "gemma3_text", "phi3", "gpt_neox", "glm"])
def test_patch_or_unpatch_inside_a_forward_keeps_it_exact(family, swap, tmp_path_factory):
    """The patched tables take the original's format (cat or repeat_interleave order,
    partial widths, two layer types), so a generating forward whose tables and rotations
    come from both sides of a swap gives the original's tokens and logits."""
    model_cls, folder = _saved(tmp_path_factory, family)
    model = _load(model_cls, folder)
    ids = torch.randint(0, VOCAB, (2, PROMPT), generator=torch.Generator().manual_seed(3))
    tokens, logits = _greedy(model, ids)
    if swap == "unpatch":
        patch(model)
    handle = _swap_before_the_last_layer(model, patch if swap == "patch" else unpatch, 3)
    got_tokens, got_logits = _greedy(model, ids)
    handle.remove()
    assert hasattr(model, "_posenc_patch") == (swap == "patch")
    torch.testing.assert_close(got_tokens, tokens, rtol=0, atol=0)
    _close(got_logits, logits, PROMPT + NEW)


@pytest.mark.parametrize("width", ["half", "cat", "repeat"])
def test_table_format_is_measured_and_read_back(width):
    """``measure_tables`` finds a rotary module's width, order and dtype rule from its
    tables, ``expand`` writes posenc's tables in that format and ``reduce`` reads them
    back exactly; a width that is neither R/2 nor R is refused by name."""
    from posenc.hf.patch_rotation import TableFormat, measure_tables

    angles = torch.arange(3.0)[None, :, None] * torch.tensor([1.0, 0.1, 0.01, 0.001])
    cos = angles.cos()  # [1, 3, R/2]
    real = TableFormat(width).expand(cos, torch.float32)
    follows = measure_tables(real, cos, real.to(torch.bfloat16))
    assert follows == TableFormat(width, None)
    fixed = measure_tables(real, cos, real)  # float32 tables whatever the input
    assert fixed == TableFormat(width, torch.float32)
    assert fixed.expand(cos, torch.bfloat16).dtype == torch.float32
    assert follows.expand(cos, torch.bfloat16).dtype == torch.bfloat16
    torch.testing.assert_close(follows.reduce(real), cos, rtol=0, atol=0)
    with pytest.raises(ValueError, match="tables of width 6"):
        measure_tables(real[..., :1].expand(1, 3, 6), cos, real)


def test_left_padded_batch_generates_the_original_tokens(tmp_path_factory):
    """Per-sequence positions ``[B, T]`` (left padding): cos/sin per row."""
    model_cls, folder = _saved(tmp_path_factory, "llama")
    model = _load(model_cls, folder)
    ids = torch.randint(1, VOCAB, (2, PROMPT), generator=torch.Generator().manual_seed(6))
    mask = torch.ones_like(ids)
    ids[0, :3], mask[0, :3] = 0, 0
    kwargs = dict(attention_mask=mask, max_new_tokens=NEW, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        tokens = model.generate(ids, **kwargs)
        patch(model)
        torch.testing.assert_close(model.generate(ids, **kwargs), tokens, rtol=0, atol=0)


SCALINGS = [
    ("llama", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}),
    ("llama", {"rope_type": "linear", "factor": 3.0}),
    ("glm", {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 16}),
    ("cohere", {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
    ("phi3", {"rope_type": "longrope", "short_factor": [1.0, 1.5, 2.0],
              "long_factor": [2.0, 3.0, 4.0], "original_max_position_embeddings": 16}),
]  # fmt: skip


@pytest.mark.parametrize(("family", "scaling"), SCALINGS)
def test_scaling_patch_equals_the_model_built_with_it(family, scaling, tmp_path_factory):
    model_cls, folder = _saved(tmp_path_factory, family)
    saved = transformers.AutoConfig.from_pretrained(folder).rope_parameters
    kept = {k: v for k, v in saved.items() if k in ("rope_theta", "partial_rotary_factor")}
    extra = {}
    if scaling["rope_type"] == "longrope":  # Phi-3 reads it from the top level
        extra["original_max_position_embeddings"] = 16
    built = _load(model_cls, folder, rope_parameters={**scaling, **kept}, **extra)
    patched = patch(_load(model_cls, folder), scaling=scaling)
    ids = torch.randint(0, VOCAB, (1, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        _close(patched(ids).logits, built(ids).logits, ids.shape[1])


def test_scaling_per_layer_type_leaves_the_others(tmp_path_factory):
    model_cls, folder = _saved(tmp_path_factory, "gemma3_text")
    full = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 16}
    params = {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {**full, "rope_theta": 1e6},
    }
    built = _load(model_cls, folder, rope_parameters=params)
    patched = patch(_load(model_cls, folder), scaling={"full_attention": full})
    ids = torch.randint(0, VOCAB, (1, 30), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        _close(patched(ids).logits, built(ids).logits, ids.shape[1])


DYNAMIC = {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
           "max_position_embeddings": 10}  # fmt: skip


@pytest.mark.parametrize("policy", [None, "transformers"])
def test_transformers_policy_reproduces_dynamic_ntk_generation(policy, tmp_path_factory):
    """The default (None) is the drop-in: the model's own generation, token for token."""
    model_cls, folder = _saved(tmp_path_factory, "llama", **DYNAMIC)
    ids = torch.randint(0, VOCAB, (1, PROMPT), generator=torch.Generator().manual_seed(4))
    tokens, logits = _greedy(_load(model_cls, folder), ids)  # crosses the original length 10
    patched = patch(_load(model_cls, folder), length_policy=policy)
    patched_tokens, patched_logits = _greedy(patched, ids)
    torch.testing.assert_close(patched_tokens, tokens, rtol=0, atol=0)
    _close(patched_logits, logits, PROMPT + NEW)


@pytest.mark.parametrize("num_layers", [1, 3])
@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_monotone_policy_keeps_cached_keys_consistent(family, num_layers, tmp_path_factory):
    """Each decoding step equals a full forward over the whole sequence with the
    frequencies of its length, for one layer and for several (the cache is recomputed
    when the frequencies change); transformers' own decoding (keys left at older
    frequencies) does not."""
    layers = {"num_hidden_layers": num_layers}
    if family == "gemma3_text":
        dynamic = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}
        layers.update(
            layer_types=["full_attention"] * num_layers, sliding_window=64,
            rope_parameters={"full_attention": dynamic, "sliding_attention": dynamic},
            max_position_embeddings=10,
        )  # fmt: skip
    else:
        layers.update(DYNAMIC)
    model_cls, folder = _saved(tmp_path_factory, family, **layers)
    ids = torch.randint(0, VOCAB, (2, 18), generator=torch.Generator().manual_seed(5))
    original = _load(model_cls, folder)
    patched = patch(_load(model_cls, folder), length_policy="monotone")
    drift = []
    with torch.no_grad():
        for model in (patched, original):
            cache = transformers.DynamicCache(config=model.config)
            model(ids[:, :8], past_key_values=cache, use_cache=True)
            steps = []
            for t in range(8, ids.shape[1]):
                step = model(ids[:, t : t + 1], past_key_values=cache, use_cache=True).logits
                full = patched(ids[:, : t + 1]).logits[:, -1:]
                steps.append((step - full).abs().max().item() / full.abs().max().item())
            drift.append(max(steps))
    eps = torch.finfo(torch.float32).eps
    assert drift[0] <= 64 * ids.shape[1] * num_layers * eps
    assert drift[1] > 10 * max(drift[0], 64 * ids.shape[1] * eps)  # well past it


def _in_threads(target, count: int) -> None:
    """Run ``target(i)`` for ``i < count``, each in its own thread, and wait for all."""
    workers = [threading.Thread(target=target, args=(i,)) for i in range(count)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


def test_monotone_policy_follows_each_cache_not_the_last_sequence(tmp_path_factory):
    """Sequences decoded in turns through one patched model, in one thread and in several:
    each cached step equals a full forward of its own sequence, though another sequence
    reached a longer length (whose frequencies the shared rotary module held)."""
    model_cls, folder = _saved(tmp_path_factory, "llama", **DYNAMIC)
    patched, fresh = (patch(_load(model_cls, folder), length_policy="monotone") for _ in "ab")
    ids = torch.randint(0, VOCAB, (4, 20), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        short, long = (transformers.DynamicCache(config=patched.config) for _ in range(2))
        patched(ids[:1, :12], past_key_values=short, use_cache=True)  # past the original 10
        patched(ids[1:2, :19], past_key_values=long, use_cache=True)
        step = patched(ids[:1, 12:13], past_key_values=short, use_cache=True).logits
        _close(step, fresh(ids[:1, :13]).logits[:, -1:], 13)
    caches = [transformers.DynamicCache(config=patched.config) for _ in range(4)]
    errors = []

    def decode(row):
        try:
            with torch.no_grad():
                patched(ids[row : row + 1, : 3 + 2 * row], past_key_values=caches[row])
                for t in range(3 + 2 * row, 16):
                    patched(ids[row : row + 1, t : t + 1], past_key_values=caches[row])
        except BaseException as exc:  # reported below
            errors.append(exc)

    _in_threads(decode, 4)
    assert not errors, errors
    with torch.no_grad():
        for row, cache in enumerate(caches):
            step = patched(ids[row : row + 1, 16:17], past_key_values=cache).logits
            _close(step, fresh(ids[row : row + 1, :17]).logits[:, -1:], 17)


def test_a_forward_that_raises_ends_its_turn(tmp_path_factory):
    """Forwards of a model with a length-dependent table take turns; one that raises (an
    out-of-vocabulary id) lets the next one, from another thread, run."""
    model_cls, folder = _saved(tmp_path_factory, "llama", **DYNAMIC)
    patched = patch(_load(model_cls, folder))
    with pytest.raises(IndexError), torch.no_grad():
        patched(torch.full((1, 4), VOCAB + 5))
    done = []
    worker = threading.Thread(target=lambda: done.append(patched(torch.zeros(1, 4).long())))
    worker.start()
    worker.join(timeout=120)
    assert done and done[0].logits.shape == (1, 4, VOCAB)


def test_unsupported_family_and_bad_scalings_raise(tmp_path_factory):
    gpt2 = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=1, n_head=2)
    )
    with pytest.raises(ValueError, match="gpt2"):
        patch(gpt2)
    model_cls, folder = _saved(tmp_path_factory, "phi3")
    model = _load(model_cls, folder)
    bad_lists = {"rope_type": "longrope", "short_factor": [1.0], "long_factor": [2.0],
                 "original_max_position_embeddings": 16}  # fmt: skip
    with pytest.raises(ValueError, match=r"phi3.*longrope factor lists have 1"):
        patch(model, scaling=bad_lists)
    with pytest.raises(ValueError, match=r"phi3.*unknown rope_type 'wavy'"):
        patch(model, scaling={"rope_type": "wavy", "factor": 2})
    with pytest.raises(ValueError, match=r"phi3.*llama3"):
        patch(model, scaling={"rope_type": "llama3", "factor": 2})
    with pytest.raises(TypeError, match="scaling must be a dict"):
        patch(model, scaling="yarn")
    with pytest.raises(ValueError, match="length_policy"):
        patch(model, length_policy="sometimes")
    assert "forward" not in model.model.layers[0].self_attn.__dict__  # nothing half patched
    with pytest.raises(ValueError, match="not patched"):
        unpatch(model)
    patch(model)
    with pytest.raises(ValueError, match="already patched"):
        patch(model)
    with pytest.raises(TypeError, match="transformers model"):
        patch(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("swap", [None, "patch", "unpatch"])
@pytest.mark.parametrize("family", ["llama", "cohere"])
def test_bfloat16_patch_is_as_close_to_float32_as_the_original(family, swap):
    """bf16 is not identical (rounding differs at every layer); what holds: the patched
    bf16 model is about as far from the float32 model as transformers' own bf16 model.
    ``swap``: patch or unpatch between two layers of the forward, whose tables, bf16 as
    transformers hands them out, serve both sides and keep it in bf16."""
    torch.manual_seed(0)
    config = _config(family, initializer_range=0.1, max_position_embeddings=512)
    model_cls = getattr(transformers, FAMILIES[family][1])
    reference = model_cls(config).eval()
    model = model_cls(config).eval()
    model.load_state_dict(reference.state_dict())
    model = model.to(torch.bfloat16)
    ids = torch.randint(0, VOCAB, (2, 200), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        want = reference(ids).logits.double()
        original = (model(ids).logits.double() - want).abs().max()
        if swap != "patch":
            patch(model)
        if swap is not None:
            _swap_before_the_last_layer(model, patch if swap == "patch" else unpatch, 1)
        got = model(ids).logits
    assert got.dtype == torch.bfloat16
    assert (got.double() - want).abs().max() <= 2 * original


def test_patch_state_belongs_to_the_model(tmp_path_factory):
    """A deep copy carries its own tracker (its decoding stays consistent while the
    original's cache is untouched); nesting and pickling are refused by name."""
    import copy
    import pickle

    model_cls, folder = _saved(tmp_path_factory, "llama", **DYNAMIC)
    patched = patch(_load(model_cls, folder), length_policy="monotone")
    twin = copy.deepcopy(patched)
    hooks = list(twin.model._forward_pre_hooks.values())
    assert hooks and all(h.tracker is twin.model.rotary_emb.tracker for h in hooks)
    assert twin.model.rotary_emb.tracker is not patched.model.rotary_emb.tracker
    ids = torch.randint(0, VOCAB, (1, 16), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        cache = transformers.DynamicCache(config=twin.config)
        twin(ids[:, :8], past_key_values=cache, use_cache=True)
        for t in range(8, 16):  # past the original length 10: the cache is recomputed
            step = twin(ids[:, t : t + 1], past_key_values=cache, use_cache=True).logits
        full = twin(ids).logits[:, -1:]
    _close(step, full, 16)
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(patched)
    with pytest.raises(ValueError, match="part of a model patched by posenc"):
        patch(patched.model)
    inner = patch(_load(model_cls, folder).model)
    with pytest.raises(ValueError, match="submodule 'model' is already patched"):
        patch(_OuterOf(inner))
    # threads share one patched model, each with its own cache: each history is its own
    errors = []

    def decode(seed):
        try:
            local = torch.randint(0, VOCAB, (1, 14), generator=torch.Generator().manual_seed(seed))
            with torch.no_grad():
                cache = transformers.DynamicCache(config=patched.config)
                patched(local[:, :6], past_key_values=cache, use_cache=True)
                for t in range(6, 14):
                    patched(local[:, t : t + 1], past_key_values=cache, use_cache=True)
            history = patched.model.rotary_emb.tracker._history[cache]
            assert torch.equal(history[0], torch.arange(14)), history
        except BaseException as exc:  # reported below
            errors.append(exc)

    _in_threads(decode, 4)
    assert not errors, errors


class _OuterOf(torch.nn.Module):
    """A model holding an already patched base model (as ``LlamaForCausalLM`` does)."""

    def __init__(self, inner):
        super().__init__()
        self.model, self.config = inner, inner.config


def test_compiled_patched_model_gives_the_eager_logits(tmp_path_factory):
    model_cls, folder = _saved(tmp_path_factory, "llama")
    model = patch(_load(model_cls, folder))
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        eager = model(ids).logits
        compiled = torch.compile(model, backend="eager")(ids).logits
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)
