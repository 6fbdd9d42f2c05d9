"""Coverage of the families of the installed transformers that have text positions.

A family (a ``transformers.models`` sub-package) has text positions when one of its rotary
embeddings is not tagged ``WITHOUT_TEXT`` in ``test_hf_families`` or when the non-rotary
walk of ``test_interop_positions`` finds it and does not tag it ``WITHOUT_TEXT`` (image
patches, audio frames, time steps, protein residues). It is matched when every such rotary
embedding and its non-rotary positions are compared with the family's own code there
(none of them ``UNSUPPORTED`` nor, for the non-rotary walk, ``PARTIAL``: families whose
released configs add positions posenc refuses by name). ``README.md`` and
``docs/interop.md`` state the count; the test keeps both true.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the coverage walks the installed transformers")


import _hf_position_walk as position_walk
import test_hf_families as rotary
import test_interop_positions as positions

README = Path(__file__).resolve().parents[1] / "README.md"
INTEROP = README.parent / "docs" / "interop.md"


def text_families() -> dict[str, bool]:
    """``{family: matched}`` over the families with text positions."""
    found: dict[str, bool] = {}
    for case in rotary.CASES:
        if case not in rotary.WITHOUT_TEXT:
            family = case.split("/", 1)[0]
            found[family] = found.get(family, True) and case not in rotary.unmatched()
    for family in position_walk.families():
        if family not in positions.WITHOUT_TEXT:
            done = family not in positions.UNSUPPORTED and family not in positions.PARTIAL
            found[family] = found.get(family, True) and done
    return found


def test_readme_states_the_text_family_coverage():
    found = text_families()
    matched, total = sum(found.values()), len(found)
    assert matched >= 0.95 * total, sorted(f for f, ok in found.items() if not ok)
    pattern = (
        r"(\d+)\s+of\s+the\s+(\d+)\s+model\s+families\s+with\s+text\s+positions\s+in\s+"
        r"transformers\s+(\S+)"
    )
    rotary.walk.check_stated_coverage((README, INTEROP), pattern, matched, total)


def test_partial_families_are_walked_families():
    assert set(positions.PARTIAL) <= set(position_walk.families()), sorted(
        set(positions.PARTIAL) - set(position_walk.families())
    )
