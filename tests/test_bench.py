"""``posenc bench`` in its tiny ``--quick`` mode: it runs, prints, and writes JSON.

No timing is asserted, ever: only that every case was measured and reported.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from posenc.bench import SUITES, run_benchmarks
from posenc.bench.report import rope_targets
from posenc.bench.rope import FLOOR, HF_STYLE
from posenc.bench.timing import Group, Stats, warm_memory
from posenc.cli import main


def test_quick_run_writes_json(tmp_path, capsys):
    path = tmp_path / "bench.json"
    assert main(["bench", "--quick", "--threads", "1", "--json", str(path)]) == 0
    printed = capsys.readouterr().out
    assert HF_STYLE in printed and "targets: not evaluated" in printed
    data = json.loads(path.read_text())
    machine = data["machine"]
    assert {"cpu_model", "cpu_cores", "torch", "torch_threads"} <= machine.keys()
    assert machine["torch_threads"] == 1
    assert {g["suite"] for g in data["groups"]} == set(SUITES)
    for group in data["groups"]:
        for case in group["cases"]:
            assert case["repeats"] == 2
            assert 0 < case["min_ms"] <= case["median_ms"] <= case["max_ms"]
    rope = [g for g in data["groups"] if g["suite"] == "rope"]
    assert {g["info"]["pass"] for g in rope} == {"forward", "forward+backward"}
    names = {c["case"] for c in rope[0]["cases"]}
    assert {
        FLOOR,
        HF_STYLE,
        "posenc apply_rope half",
        "posenc apply_rope_ interleaved (in place)",
    } <= names
    floor = next(c for c in rope[0]["cases"] if c["case"] == FLOOR)
    assert floor["x_floor"] == pytest.approx(1.0)
    assert data["targets"] == []


def test_only_one_suite():
    results = run_benchmarks(only=["additive"], quick=True, repeats=1)
    assert {g.suite for g in results.groups} == {"additive"}
    assert results.bias_memory == [] and results.external == {}


def _group(shape, dtype, kind, medians):
    stats = {name: Stats(m, m, m, m, m, 1) for name, m in medians.items()}
    info = {"shape": shape, "dtype": dtype, "pass": kind}
    return Group("rope", "t", stats, floor=FLOOR, speedup_over=(HF_STYLE,), info=info)


def test_targets_are_ratios_of_medians():
    medians = {FLOOR: 10.0, HF_STYLE: 300.0}
    for layout, fresh, in_place in (("half", 15.0, 12.0), ("interleaved", 25.0, 14.0)):
        medians[f"posenc apply_rope {layout}"] = fresh
        medians[f"posenc apply_rope_ {layout} (in place)"] = in_place
    group = _group([4, 16, 2048, 64], "float32", "forward", medians)
    label = "[4, 16, 2048, 64] float32 forward"
    targets = {t.name.removeprefix(label + " "): t for t in rope_targets([group])}
    fresh_half = targets["half: apply_rope / copy floor"]
    assert (fresh_half.value, fresh_half.limit, fresh_half.at_most, fresh_half.met) == (
        1.5,
        2.0,
        True,
        True,
    )
    assert not targets["interleaved: apply_rope / copy floor"].met  # 2.5 > 2
    assert targets["half: apply_rope_ / copy floor"].value == pytest.approx(1.2)
    speedup = targets[f"half: x faster than {HF_STYLE}"]
    assert speedup.value == pytest.approx(20.0) and speedup.met
    assert rope_targets([_group([1, 2, 3, 4], "float32", "forward", medians)]) == []


@pytest.mark.skipif(not Path("/proc/meminfo").exists(), reason="needs /proc/meminfo")
def test_warm_memory_touches_whole_blocks():
    assert warm_memory(5 << 20, block=2 << 20) == 4 << 20


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--only", "nothing"], "--only"),
        (["--threads", "0"], "threads"),
        (["--json", "/nonexistent-dir/x.json"], "does not exist"),
    ],
)
def test_bad_options_exit_2(argv, message, capsys):
    assert main(["bench", "--quick", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
