"""Every measured figure the README and docs/performance.md quote equals the records it cites.

Each claim names the sentence it is quoted in (a regular expression whose group ``r`` is
the figure: ``1.00–1.16`` or ``1.26``), the records it cites and the cells of those records
it summarizes; a quoted range must be the minimum and maximum over exactly those cells,
rounded to the decimals quoted.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
FIGURE = r"(?P<r>\d+(?:\.\d+)?(?:–\d+(?:\.\d+)?)?)"

ROPE_QUIET = ("rope-2cpu-quiet-r13.json", "rope-2cpu-quiet-r13b.json")
ROPE_LOAD = ("rope-2cpu-load2-r13.json", "rope-2cpu-load2-r13b.json")
ATTENTION = tuple(f"attention-2cpu-quiet-{r}.json" for r in ("r14", "r13", "r12b", "r12c"))
ATTENTION_8_HEADS = ("attention-2cpu-quiet-r16.json",)
ATTENTION_8_HEADS_KEPT = ("attention-2cpu-quiet-kept-r16.json",)
ATTENTION_8_HEADS_LOAD = ("attention-2cpu-load2-kept-r17.json",)
MODULE = "rope-module-2cpu-load7.json"
H200 = "cuda-h200/triton-rope-h200.json"
H200_BEFORE = "cuda-h200/triton-rope-h200-previous-interleaved.json"


@cache
def _record(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def _targets(records: Iterable[str], keep: Callable[[str], bool]) -> list[float]:
    return [t["value"] for r in records for t in _record(r)["targets"] if keep(t["name"])]


def _median(*words: str) -> Callable[[str], bool]:
    """A target's median ratio whose name holds every one of ``words``."""
    return lambda name: "(max)" not in name and all(w in name for w in words)


def _maximum(*words: str) -> Callable[[str], bool]:
    return lambda name: "(max)" in name and all(w in name for w in words)


def _floor_ratios(records: Iterable[str], shape: str, dtype: str, cases: Iterable[str]) -> list:
    """``x_floor`` of the GPU groups' ``cases`` at ``shape`` (``[1, 32, 8192, 128]``)."""
    return [
        c["x_floor"]
        for r in records
        for g in _record(r)["groups"]
        if g["title"].startswith(f"GPU RoPE {shape} {dtype}")
        for c in g["cases"]
        if c["case"] in cases
    ]


@dataclass(frozen=True)
class Claim:
    doc: str  # the file, relative to the repository
    sentence: str  # a regular expression; its group ``r`` is the quoted figure
    cells: Callable[[], list[float]]  # the cited records' cells the figure summarizes


def _gpu(records: Iterable[str], dtype: str, *layouts: str) -> Callable[[], list[float]]:
    cases = [f"posenc.triton {lay}{mode}" for lay in layouts for mode in ("", ", in place")]
    return lambda: _floor_ratios(records, "[1, 32, 8192, 128]", dtype, cases)


def _seconds(run: str) -> Callable[[], list[float]]:
    path = ROOT / "runs-recorded" / run / "results.json"
    return lambda: [r["seconds"] for r in json.loads(path.read_text())["runs"]]


def _attention(*names: str, maximum: bool = False) -> Callable[[], list[float]]:
    pick = _maximum if maximum else _median
    records = ATTENTION_8_HEADS_KEPT
    return lambda: [v for n in names for v in _targets(records, pick(f" {n}: ÷ SDPA"))]


def _module(words: str, key: str = "value", maximum: bool = False) -> Callable[[], list]:
    """``key`` of the module record's targets named by ``words`` (medians or maxima)."""
    pick = _maximum if maximum else _median
    return lambda: [t[key] for t in _record(MODULE)["targets"] if pick(words)(t["name"])]


def _attention_at(
    t: str, name: str, maximum: bool = False, records: tuple[str, ...] = ATTENTION
) -> Callable[[], list[float]]:
    pick = _maximum if maximum else _median
    return lambda: _targets(records, pick(f"T={int(t):,} {name}: ÷ SDPA"))


README, PERF = "README.md", "docs/performance.md"
CLAIMS = [
    Claim(
        README,
        rf"`posenc\.apply_rope` costs {FIGURE}× a copy\s+into a fresh tensor",
        lambda: _targets(ROPE_QUIET + ROPE_LOAD, _median(": ÷ clone")),
    ),
    Claim(
        README,
        rf"in place {FIGURE}× a copy into a preallocated one",
        lambda: _targets(ROPE_QUIET + ROPE_LOAD, _median("_: ÷ floor")),
    ),
    Claim(
        README,
        rf"is {FIGURE}× faster than the transformers-style expression\s+"
        r"`x\*cos \+ rotate_half\(x\)\*sin` in fp32",
        lambda: _targets(ROPE_QUIET[:1], _median("× faster", "fp32")),
    ),
    Claim(
        README,
        rf"`x\*cos \+ rotate_half\(x\)\*sin` in fp32, {FIGURE}× in bf16",
        lambda: _targets(ROPE_QUIET[:1], _median("× faster", "bf16")),
    ),
    Claim(
        PERF,
        rf"posenc is {FIGURE}× faster in fp32",
        lambda: _targets(ROPE_QUIET, _median("× faster", "fp32")),
    ),
    Claim(
        PERF,
        rf"faster in fp32 and {FIGURE}× in bf16\s+\(quiet",
        lambda: _targets(ROPE_QUIET, _median("× faster", "bf16")),
    ),
    Claim(
        PERF,
        rf"with backward\), {FIGURE}× and",
        lambda: _targets(ROPE_LOAD, _median("× faster", "fp32")),
    ),
    Claim(
        PERF,
        rf"with backward\), [\d.–]+× and\s+{FIGURE}× under load",
        lambda: _targets(ROPE_LOAD, _median("× faster", "bf16")),
    ),
    Claim(
        README,
        rf"Triton RoPE kernel at {FIGURE}× the HBM copy floor\s+in fp32, both layouts",
        _gpu([H200], "float32", "half-split", "interleaved"),
    ),
    *(
        Claim(PERF, rf"\| {label}, H200 \|{cells} {FIGURE}× \|", _gpu(records, dtype, layout))
        for dtype, label in (("float32", "fp32"), ("bfloat16", "bf16"))
        # the table's columns: half-split (now and before), interleaved now, interleaved before
        for cells, records, layout in (
            ("", [H200, H200_BEFORE], "half-split"),
            (r" [\d.–]+× \|", [H200], "interleaved"),
            (r" [\d.–]+× \| [\d.–]+× \|", [H200_BEFORE], "interleaved"),
        )
    ),
    Claim(README, rf"18 runs took {FIGURE} s each", _seconds("cuda-h200-stdlib")),
    Claim(PERF, rf"18\s+runs took {FIGURE} s each", _seconds("cuda-h200-stdlib")),
    Claim(
        PERF,
        rf"`RotaryEmbedding\(\)\(q, k\)`.{{0,60}} costs {FIGURE}×\s+`apply_rope`",
        _module("RotaryEmbedding: ÷ apply_rope"),
    ),
    Claim(
        PERF,
        rf"\(the A/A spread\) gave {FIGURE}×",
        _module("RotaryEmbedding: ÷ apply_rope", "baseline_spread"),
    ),
    Claim(
        PERF,
        rf"Maxima are reported, not gated: {FIGURE}×",
        _module("RotaryEmbedding: ÷ apply_rope", maximum=True),
    ),
    Claim(PERF, rf"on 2 threads costs {FIGURE}× one thread", _module("2 threads: ÷ 1 thread")),
    Claim(
        PERF, rf"\(A/A {FIGURE}×\)\. To rerun", _module("2 threads: ÷ 1 thread", "baseline_spread")
    ),
    Claim(
        PERF,
        rf"load average {FIGURE} rising to [\d.]+\s+\(`benchmarks/results/rope-module",
        lambda: [_record(MODULE)["machine"]["load_average_before"][0]],
    ),
    Claim(
        PERF,
        rf"load average [\d.]+ rising to {FIGURE}\s+\(`benchmarks/results/rope-module",
        lambda: [_record(MODULE)["machine"]["load_average"][0]],
    ),
    Claim(README, rf"costs {FIGURE}× causal SDPA with ALiBi", _attention("alibi")),
    Claim(README, rf"{FIGURE}× with T5", _attention("t5")),
    Claim(README, rf"{FIGURE}× with\s+KERPLE or Sandwich", _attention("kerple", "sandwich")),
    Claim(README, rf"{FIGURE}× with\s+FIRE or Shaw", _attention("fire", "shaw")),
    Claim(README, rf"{FIGURE}× with CoPE\.", _attention("cope")),
    Claim(
        README,
        rf"CoPE reaches {FIGURE}× at 256 tokens",
        _attention_at("256", "cope", records=ATTENTION_8_HEADS),
    ),
    Claim(
        README,
        rf"Shaw {FIGURE}× at 512",
        _attention_at("512", "shaw", records=ATTENTION_8_HEADS),
    ),
    Claim(
        README,
        rf"CoPE takes {FIGURE}× at 256 tokens",
        _attention_at("256", "cope", records=ATTENTION_8_HEADS_LOAD),
    ),
    Claim(
        PERF,
        rf"short forms of CoPE and Shaw lose the most: they cost\s+{FIGURE}× causal SDPA",
        lambda: [
            v
            for n in ("cope", "shaw")
            for v in _attention_at("256", n, records=ATTENTION_8_HEADS_LOAD)()
        ],
    ),
    Claim(
        PERF,
        rf"FIRE's {FIGURE}× at 256 tokens comes from the baseline's",
        _attention_at("256", "fire", records=ATTENTION_8_HEADS_LOAD),
    ),
    Claim(
        PERF,
        rf"The A/A control of causal SDPA spread up to {FIGURE}× here",
        lambda: [
            max(
                t["baseline_spread"]
                for t in _record(ATTENTION_8_HEADS_LOAD[0])["targets"]
                if _median("attention T=")(t["name"])
            )
        ],
    ),
]

#: The columns of performance.md's bias-attention tables, as the records name them.
ATTENTION_COLUMNS = ("alibi", "t5", "kerple", "sandwich", "fire", "shaw", "cope")
#: Each table: its lengths, the records it quotes and the paragraph right after it (the
#: rows between the cell and that paragraph are table rows only).
ATTENTION_TABLES = (
    (("2048", "4096", "8192"), ATTENTION, "Every median meets its target"),
    (("256", "512", "1024", "2048", "4096", "8192"), ATTENTION_8_HEADS_KEPT, "All 42 of the 42"),
    (("256", "512", "1024", "2048", "4096", "8192"), ATTENTION_8_HEADS, "With glibc's own"),
    (("256", "512", "1024", "2048", "4096", "8192"), ATTENTION_8_HEADS_LOAD, "Under load, 26"),
)
for _lengths, _records, _after in ATTENTION_TABLES:
    for _t in _lengths:
        for _i, _name in enumerate(ATTENTION_COLUMNS):
            _before = r" [^|]+ \|" * _i
            for _maximum_too in (False, True):
                _cell = rf"{FIGURE} \([^)]+\)" if not _maximum_too else rf"[\d.–]+ \({FIGURE}\)"
                _rest = rf"(?=[^\n]*(?:\n\|[^\n]*)*\n\n{_after})"
                CLAIMS.append(
                    Claim(
                        PERF,
                        rf"\| {_t} \|{_before} {_cell} \|{_rest}",
                        _attention_at(_t, _name, _maximum_too, _records),
                    )
                )


def _quoted(claim: Claim) -> str:
    text = (ROOT / claim.doc).read_text().replace("**", "")
    found = [m["r"] for m in re.finditer(claim.sentence, text, flags=re.DOTALL)]
    assert len(found) == 1, f"{claim.doc}: {claim.sentence!r} found {len(found)} times"
    return found[0]


def _rounded(cells: list[float], quoted: str) -> str:
    decimals = len(quoted.split("–")[0].partition(".")[2])
    low, high = (f"{v:.{decimals}f}" for v in (min(cells), max(cells)))
    return low if low == high and "–" not in quoted else f"{low}–{high}"


def _name(claim: Claim) -> str:
    words = re.sub(r"\(\?P<r>.*?\)\?\)|\[.*?\]|[^A-Za-z0-9 ]", " ", claim.sentence).split()
    return f"{Path(claim.doc).stem}: {' '.join(words)[:60]}"


@pytest.mark.parametrize("claim", CLAIMS, ids=_name)
def test_a_quoted_figure_equals_its_records(claim):
    cells = claim.cells()
    assert cells, f"no cell of the cited records matches {claim.sentence!r}"
    quoted = _quoted(claim)
    assert quoted == _rounded(cells, quoted)


def test_the_maxima_missed_are_counted_over_the_cited_cells():
    maxima = [
        t
        for r in ROPE_QUIET + ROPE_LOAD
        for t in _record(r)["targets"]
        if "(max)" in t["name"] and ("÷ clone" in t["name"] or "_: ÷ floor" in t["name"])
    ]
    missed = sum(not t["met"] for t in maxima)
    phrase = f"missed in {missed} of the {len(maxima)} cells"
    assert phrase in (ROOT / README).read_text()
    assert phrase.replace("missed", "miss") in (ROOT / PERF).read_text()


def test_a_figure_that_does_not_match_fails():
    claim = Claim(README, "", lambda: [1.004, 1.164])
    assert _rounded(claim.cells(), "1.00–1.16") == "1.00–1.16"
    assert _rounded(claim.cells(), "1.0–1.2") == "1.0–1.2"
    assert _rounded([3.81, 5.88], "3.8–4.4") != "3.8–4.4"


def test_the_module_target_said_met_is_met_at_every_shape():
    medians = [t for t in _record(MODULE)["targets"] if _median("÷ apply_rope")(t["name"])]
    assert len(medians) == 4 and all(t["met"] and t["limit"] == 1.1 for t in medians)
    assert "(target ≤ 1.1×, met at every\nshape)" in (ROOT / PERF).read_text()


@pytest.mark.parametrize(
    ("record", "sentence"),
    [
        (ATTENTION_8_HEADS_KEPT[0], "All {m} of the {n} medians meet their limit with freed memory "
         "kept, and {x} of the {n} maxima"),
        (ATTENTION_8_HEADS[0], "With glibc's own thresholds, {m} of the {n} medians meet their "
         "limit"),
        (ATTENTION_8_HEADS_LOAD[0], "Under load, {m} of the {n} medians meet their limit, and "
         "{x} of the {n} maxima do"),
    ],
)  # fmt: skip
def test_the_counts_of_targets_met_are_the_records(record, sentence):
    targets = [t for t in _record(record)["targets"] if t["name"].startswith("attention T=")]
    medians = [t for t in targets if "(max)" not in t["name"]]
    maxima = [t for t in targets if "(max)" in t["name"]]
    counts = {"m": sum(t["met"] for t in medians), "x": sum(t["met"] for t in maxima)}
    text = " ".join((ROOT / PERF).read_text().split())
    assert sentence.format(n=len(medians), **counts) in text
