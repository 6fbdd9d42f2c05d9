"""Every model class of the installed diffusers is matched by posenc or listed with a reason.

The walk imports each module of ``diffusers.models.transformers`` and collects its model
classes (``ModelMixin`` subclasses defined there). Each must be a class of a row of
``posenc.diffusers.FAMILIES`` with a parity case in ``tests/_diffusers_cases`` or a row of
the "Not matched" table of ``docs/diffusers.md``, never both; the page's coverage line
and the README's and ``docs/interop.md``'s must be the walk's count and the installed
version.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest

diffusers = pytest.importorskip("diffusers")

from diffusers.models import transformers as transformer_modules  # noqa: E402
from diffusers.models.modeling_utils import ModelMixin  # noqa: E402

from _diffusers_cases import NOPE_CLASSES, ROPE_CASES, TABLE_CASES  # noqa: E402
from posenc import PositionalEncoding  # noqa: E402
from posenc.diffusers import FAMILIES, diffusers_positions, from_diffusers  # noqa: E402

PAGE = Path(__file__).resolve().parents[1] / "docs" / "diffusers.md"


def _model_classes() -> set[str]:
    names = set()
    for info in pkgutil.iter_modules(transformer_modules.__path__):
        module = importlib.import_module(f"{transformer_modules.__name__}.{info.name}")
        for name, value in vars(module).items():
            if (
                inspect.isclass(value)
                and issubclass(value, ModelMixin)
                and value.__module__ == module.__name__
            ):
                names.add(name)
    return names


def _section(title: str) -> str:
    text = PAGE.read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def _documented_unmatched() -> dict[str, str]:
    rows = re.findall(r"^\| `(\w+)` \| (.+) \|$", _section("Not matched"), flags=re.M)
    return dict(rows)


MATCHED = {name for row in FAMILIES for name in row.classes}


def test_every_model_class_is_matched_or_documented():
    walk = _model_classes()
    unmatched = _documented_unmatched()
    assert not MATCHED & set(unmatched), sorted(MATCHED & set(unmatched))
    assert walk - MATCHED == set(unmatched), {
        "undocumented": sorted(walk - MATCHED - set(unmatched)),
        "documented but matched or gone": sorted(set(unmatched) - (walk - MATCHED)),
    }
    assert all(reason.strip() for reason in unmatched.values())


def test_every_matched_class_has_a_parity_case_and_is_in_diffusers():
    cases = {case.class_name for case in ROPE_CASES + TABLE_CASES} | set(NOPE_CLASSES)
    assert cases == MATCHED, {"no case": sorted(MATCHED - cases), "no row": sorted(cases - MATCHED)}
    assert _model_classes() >= MATCHED


def test_page_lists_the_matched_classes_and_the_walks_coverage():
    rows = re.findall(r"^\| .+ \| (.+) \|$", _section("Matched"), flags=re.M)
    matched_page = {name for cell in rows for name in re.findall(r"`(\w+)`", cell)}
    assert matched_page == MATCHED
    version = ".".join(diffusers.__version__.split(".")[:3])
    line = f"Coverage: **{len(MATCHED)} / {len(_model_classes())}** model classes"
    assert line in PAGE.read_text()
    assert f"diffusers {version}" in _section("Coverage")
    total = len(_model_classes())
    for page in (PAGE.parents[1] / "README.md", PAGE.parent / "interop.md"):
        text = " ".join(page.read_text().split())  # lines joined
        line = f"**{len(MATCHED)} of the {total} model classes of diffusers {version}**"
        assert line in text, page


@pytest.mark.parametrize("name", sorted(MATCHED))
def test_released_defaults_build(name):
    """A bare class name builds from the class's own defaults (its released config)."""
    module = from_diffusers(name, patch_size=2)
    assert isinstance(module, PositionalEncoding)


def test_unknown_class_and_bad_configs_raise():
    with pytest.raises(ValueError, match="no positions known for diffusers class 'Nope'"):
        from_diffusers("Nope")
    with pytest.raises(ValueError, match="_class_name"):
        from_diffusers({"attention_head_dim": 64})
    with pytest.raises(TypeError, match="config must be"):
        from_diffusers(3)
    with pytest.raises(ValueError, match="use_learned_positional_embeddings"):
        from_diffusers("CogVideoXTransformer3DModel", use_learned_positional_embeddings=True)
    with pytest.raises(ValueError, match="use_layer3d_rope"):
        diffusers_positions("QwenImageTransformer2DModel", height=2, width=2, use_layer3d_rope=True)
    with pytest.raises(ValueError, match="axis_dim must be 3 even sizes"):
        from_diffusers("FluxTransformer2DModel", axes_dims_rope=(16, 56, 64))
