"""posenc bench's ring suite: ring attention on two processes against the unsplit layer,
with the bytes each step sends (quick shapes; no time is asserted)."""

from __future__ import annotations

import pytest

from posenc.bench import SUITES
from posenc.bench.ring import ENCODINGS, ring_groups


@pytest.mark.distributed
def test_ring_suite_times_each_encoding_against_unsplit():
    assert "ring" in SUITES
    groups = ring_groups(quick=True, repeats=1, warmup=0)
    assert [g.title.split()[0] for g in groups] == list(ENCODINGS)
    for group, name in zip(groups, ENCODINGS, strict=True):
        assert set(group.stats) == {f"{name} unsplit", f"{name} ring"}
        assert group.speedup(f"{name} ring", f"{name} unsplit") > 0
        info = group.info
        # forward alone sends the other rank this rank's keys and values once (float32)
        shard = info["batch"] * info["length"] // info["processes"] * info["d_model"]
        assert info["bytes_sent_per_step"] >= 2 * shard * 4
        assert group.to_json()["info"]["bytes_sent_per_step"] == info["bytes_sent_per_step"]
