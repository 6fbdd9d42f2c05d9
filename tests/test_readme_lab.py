"""Every number the README's lab section quotes, read back from the record it cites:
table cells (the report's mean over seeds, to two decimals), effects, seed-level
p-values (the mixed model, Holm-corrected, to two significant figures), which pairs are
separated and how many seeds agree."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from posenc.lab import stats
from posenc.lab.tokenlevel import token_comparisons

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
CODE, PROSE = "r10-thorough-stdlib", "r10-thorough-fortunes"
POS_CODE, POS_PROSE = "r10-positions-stdlib", "r8-positions-fortunes"


@cache
def _results(record: str) -> dict:
    return json.loads((ROOT / "runs-recorded" / record / "results.json").read_text())


def cell(record: str, label: str, length: int) -> str:
    (row,) = [r for r in stats.rows(_results(record)) if r.label == label]
    return f"{row.cells[str(length)].mean:.2f}"


def pair(record: str, length: int, first: str, second: str) -> dict:
    """The recorded comparison with ``first`` the better row (fails if it is not)."""
    found = [
        c
        for c in _results(record)["comparisons"]
        if c["length"] == str(length) and (c["first"], c["second"]) == (first, second)
    ]
    assert found, f"{first} is not better than {second} at {length} in {record}"
    return found[0]


def _said(text: str) -> None:
    assert text in " ".join(README.split()), f"the README no longer says {text!r}"


def test_the_readme_cites_the_records_it_quotes():
    for record in (CODE, PROSE, POS_CODE, POS_PROSE):
        assert f"(runs-recorded/{record}/report.md)" in README


def test_alibi_flat_and_best_at_8x_and_16x():
    for record, at in ((CODE, "on code"), (PROSE, "on prose")):
        _said(f"{cell(record, 'alibi', 64)} → {cell(record, 'alibi', 1024)} {at}")
    for record in (CODE, PROSE):
        for n in (512, 1024):
            mine = [c for c in _results(record)["comparisons"] if c["length"] == str(n)]
            against = [c for c in mine if "alibi" in (c["first"], c["second"])]
            assert all(c["first"] == "alibi" and c["separated"] for c in against)
            assert all(c["wins"] == c["seeds"] == 6 for c in against)
    for record, at in ((CODE, "on code"), (PROSE, "on prose")):
        e = [pair(record, n, "alibi", "rope +ft")["effect"] for n in (512, 1024)]
        _said(f"×{e[0]:.2f} and ×{e[1]:.2f} {at}")


def test_rope_at_the_training_length_and_beyond():
    code = pair(CODE, 64, "rope", "alibi")
    assert code["separated"] and code["wins"] == 6
    _said(
        f"({cell(CODE, 'rope', 64)}; ALiBi {cell(CODE, 'alibi', 64)}, "
        f"p_Holm = {code['p_seed_holm']:.2g})"
    )
    prose = pair(PROSE, 64, "rope", "alibi")
    assert not prose["separated"] and prose["wins"] == 6
    _said(f"({cell(PROSE, 'rope', 64)} against {cell(PROSE, 'alibi', 64)})")
    _said(f"(p_Holm = {prose['p_seed_holm']:.2g})")
    _said(f"({cell(CODE, 'rope', 1024)} and {cell(PROSE, 'rope', 1024)} at 1024)")


def test_yarn_and_the_fine_tune():
    yarn, tuned = "rope +yarn +hf", "rope +ft"
    _said(f"{cell(CODE, yarn, 1024)} and {cell(PROSE, yarn, 1024)} at 1024 and beats NTK-aware")
    _said(f"brings it to {cell(CODE, tuned, 1024)} and {cell(PROSE, tuned, 1024)};")
    for record in (CODE, PROSE):
        for n in (256, 512, 1024):
            c = pair(record, n, yarn, "rope +ntk")
            assert c["separated"] and c["wins"] == 6


def test_what_is_not_established():
    pi = [pair(r, 1024, "rope", "rope +linear") for r in (CODE, PROSE)]
    ft = [pair(r, 1024, "rope +ft", "rope +linear +ft") for r in (CODE, PROSE)]
    assert not any(c["separated"] for c in pi + ft)
    _said(
        f"(p_Holm = {pi[0]['p_seed_holm']:.2g} on code, {pi[1]['p_seed_holm']:.2g} on prose; "
        f"and {ft[0]['p_seed_holm']:.2g}, {ft[1]['p_seed_holm']:.2g})"
    )
    for record in (CODE, PROSE):
        for n in (128, 256):
            assert pair(record, n, "rope", "rope +linear")["separated"]
        for n in (64, 128, 256):
            assert pair(record, n, "rope +ft", "rope +linear +ft")["separated"]


@pytest.mark.parametrize("record", [POS_CODE, POS_PROSE])
def test_stick_breaking_then_fox_lowest_in_every_seed(record):
    found = _results(record)["comparisons"]
    for who, above in (("stick_breaking", ()), ("fox", ("stick_breaking",))):
        mine = [c for c in found if who in (c["first"], c["second"])]
        mine = [c for c in mine if not {c["first"], c["second"]} & set(above)]
        assert all(c["first"] == who and c["wins"] == c["seeds"] for c in mine)
    assert len(_results(record)["seeds"]) == (6 if record == POS_CODE else 3)


def _at(record: str, n: int) -> list[dict]:
    return [c for c in _results(record)["comparisons"] if c["length"] == str(n)]


def test_positions_numbers():
    sb, fox, lens = "stick_breaking", "fox", (64, 128, 256, 512, 1024)
    _said(f"({cell(POS_CODE, sb, 1024)} on code, {cell(POS_PROSE, sb, 1024)} on prose at 1024)")
    _said(f"then FoX ({cell(POS_CODE, fox, 1024)}, {cell(POS_PROSE, fox, 1024)})")
    for n in lens:  # code, 6 seeds: stick-breaking separated from every row
        assert all(c["separated"] for c in _at(POS_CODE, n) if sb in (c["first"], c["second"]))
    for n in lens[1:]:  # FoX from every row but stick-breaking, from 2x
        mine = [c for c in _at(POS_CODE, n) if c["first"] == fox]
        assert len(mine) == 5 and all(c["separated"] for c in mine)
    assert not all(c["separated"] for c in _at(POS_CODE, 64) if c["first"] == fox)
    path = [pair(POS_CODE, n, "path", "alibi") for n in lens]
    assert all(c["separated"] for c in path[:4]) and not path[4]["separated"]
    _said(f"(at 16x p_Holm = {path[4]['p_seed_holm']:.2g})")
    fope = [pair(POS_CODE, n, "fope", "rope") for n in (256, 512, 1024)]
    assert all(c["wins"] == 6 and not c["separated"] for c in fope)
    _said(f"(p_Holm ≥ {min(c['p_seed_holm'] for c in fope):.2g})")
    for record in (POS_CODE, POS_PROSE):
        rope = [
            c
            for c in _results(record)["comparisons"]
            if {"p_rope", "rope"} == {c["first"], c["second"]}
        ]
        assert rope and not any(c["separated"] for c in rope)
    counts = [sum(c["first"] == sb and c["separated"] for c in _at(POS_PROSE, n)) for n in lens]
    _said(f"separates stick-breaking from {min(counts)}-{max(counts)} of the other rows")
    prose = [pair(POS_PROSE, n, sb, fox) for n in lens]
    assert all(c["separated"] for c in prose)
    _said(f"(p_Holm ≤ {max(c['p_seed_holm'] for c in prose):.2g})")
    assert not any(pair(POS_PROSE, n, "path", "alibi")["separated"] for n in lens)
    fope = [n for n in (256, 512, 1024) if pair(POS_PROSE, n, "fope", "rope")["separated"]]
    assert fope == [512]  # "FoPE only at 8x"


def _tokens(task: str) -> list:
    return token_comparisons(_results(f"r10-tasks/{task}"))


def test_tasks_claims():
    for task in ("copy", "reverse", "recall", "addition", "sort"):
        assert f"(runs-recorded/r10-tasks/{task}/report.md)" in README
    assert not any(run.get("learned") for run in _results("r10-tasks/addition")["runs"])
    _said("none learns addition")
    _said("NoPE and T5 lead on sort, ahead of ALiBi and RoPE")
    sort = {(c.length, c.first, c.second): c for c in _tokens("sort")}
    for n in ("64", "96", "128"):
        for lead in ("nope", "t5"):
            for behind in ("alibi", "rope"):
                c = sort[n, lead, behind]
                assert c.separated and c.wins == c.seeds == 6
    copy = [c for c in _tokens("copy") if c.length in ("64", "96", "128")]
    against = [c for c in copy if "alibi" in (c.first, c.second)]
    assert against and all(c.first == "alibi" and c.separated and c.wins == 6 for c in against)
