"""``posenc bench`` in its tiny ``--quick`` mode: it runs, prints within 80 columns,
writes JSON, runs busy processes beside itself and stops them, and imports nothing from
the current directory.

No timing is asserted, ever: only that every case was measured and reported.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from posenc.bench import SUITES, run_benchmarks
from posenc.bench.load import busy_processes
from posenc.bench.report import Target, print_targets, rope_targets
from posenc.bench.rope import BACKWARD_FLOOR, CLONE, CONTROLS, FLOOR, HF_STYLE
from posenc.bench.timing import Group, Stats, median_ratio, with_control
from posenc.cli import main


def test_quick_run_prints_80_columns_and_writes_json(tmp_path, capsys):
    path = tmp_path / "bench.json"
    assert main(["bench", "--quick", "--threads", "1", "--json", str(path)]) == 0
    printed = capsys.readouterr().out
    assert HF_STYLE in printed and "targets: not evaluated" in printed
    assert "RoPE on CPU: " in printed and "load average: " in printed
    lines = printed.splitlines()
    assert max(len(line) for line in lines) <= 80, "a table is wider than 80 columns"
    assert "…" not in printed, "a header or cell was truncated"
    assert path.stat().st_mode & 0o777 == 0o644 and list(tmp_path.iterdir()) == [path]
    data = json.loads(path.read_text())
    machine = data["machine"]
    assert {"cpu_model", "cpu_cores", "torch", "torch_threads", "load_average"} <= machine.keys()
    assert machine["torch_threads"] == 1 and data["settings"]["busy_processes"] == 0
    assert data["rope_cpu"]
    assert (
        {"rope", "additive", "bias", "attention"}
        <= {g["suite"] for g in data["groups"]}
        <= set(SUITES)
    )
    for group in data["groups"]:
        for case in group["cases"]:
            assert case["repeats"] == 2
            assert 0 < case["min_ms"] <= case["median_ms"] <= case["max_ms"]
    rope = [g for g in data["groups"] if g["suite"] == "rope"]
    assert {g["info"]["pass"] for g in rope} == {"forward", "forward+backward"}
    names = {c["case"] for c in rope[0]["cases"]}
    assert {FLOOR, HF_STYLE, "apply_rope half", "apply_rope_ intl (in place)"} <= names
    floor = next(c for c in rope[0]["cases"] if c["case"] == FLOOR)
    assert floor["x_floor"] == pytest.approx(1.0)
    assert {row["encoding"] for row in data["bias_attention"]} >= {"alibi", "t5"}
    assert data["targets"] == []


def test_nothing_is_imported_from_the_current_directory(tmp_path, monkeypatch):
    """A ``benchmarks/bench_bias_attention.py`` in the working directory is not run."""
    marker = tmp_path / "executed"
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "bench_bias_attention.py").write_text(
        f"open({str(marker)!r}, 'w').close()\n", encoding="utf-8"
    )
    monkeypatch.chdir(tmp_path)
    results = run_benchmarks(only=["bias"], quick=True, repeats=1)
    assert results.bias_attention and not marker.exists()
    assert main(["bench", "--quick", "--only", "bias", "--repeats", "1"]) == 0
    assert not marker.exists()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_busy_processes_run_and_are_stopped_even_on_error():
    with pytest.raises(KeyboardInterrupt), busy_processes(2) as pids:
        assert len(pids) == 2 and all(_alive(pid) for pid in pids)
        raise KeyboardInterrupt
    assert not any(_alive(pid) for pid in pids)


def test_load_is_recorded():
    results = run_benchmarks(only=["additive"], quick=True, repeats=1, load=1)
    assert results.settings["busy_processes"] == 1
    assert len(results.machine["load_average_before"]) == 3


def test_only_one_suite():
    results = run_benchmarks(only=["additive"], quick=True, repeats=1)
    assert {g.suite for g in results.groups} == {"additive"}
    assert results.bias_memory == [] and results.bias_attention == []


def _group(shape, dtype, kind, medians, maxima=None):
    maxima = maxima or medians
    stats = {name: Stats(m, m, m, m, maxima[name], 1) for name, m in medians.items()}
    info = {"shape": shape, "dtype": dtype, "pass": kind}
    return Group("rope", "t", stats, floor=FLOOR, speedup_over=(HF_STYLE,), info=info)


def test_targets_are_ratios_of_medians_and_maxima():
    medians = {FLOOR: 10.0, CLONE: 12.5, HF_STYLE: 300.0}
    for layout, fresh, in_place in (("half", 15.0, 10.5), ("intl", 25.0, 14.0)):
        medians[f"apply_rope {layout}"] = fresh
        medians[f"apply_rope_ {layout} (in place)"] = in_place
    maxima = {**medians, FLOOR: 20.0, "apply_rope half": 30.0}
    group = _group([4, 16, 2048, 64], "float32", "forward", medians, maxima)
    targets = {t.what: t for t in rope_targets([group])}
    assert {t.group for t in targets.values()} == {"[4,16,2048,64] fp32 fwd"}
    fresh_half = targets["half: ÷ clone"]
    assert (fresh_half.value, fresh_half.limit, fresh_half.at_most, fresh_half.met) == (
        pytest.approx(1.2),
        1.2,
        True,
        True,
    )
    assert not targets["intl: ÷ clone"].met  # 2.0 > 1.2
    assert targets["half: ÷ clone (max)"].value == pytest.approx(30.0 / 12.5)
    assert targets["half_: ÷ floor"].value == pytest.approx(1.05)
    assert targets["half_: ÷ floor"].met
    assert targets["half_: ÷ floor (max)"].value == pytest.approx(10.5 / 20.0)
    assert not targets["intl_: ÷ floor"].met  # 1.4 > 1.1
    speedup = targets["half: × faster"]
    assert speedup.value == pytest.approx(20.0) and speedup.met
    slowest = targets["slowest: × faster"]
    assert slowest.value == pytest.approx(300.0 / 25.0) and slowest.met
    assert targets["slowest: × faster (max)"].value == pytest.approx(300.0 / 30.0)
    assert rope_targets([_group([1, 2, 3, 4], "float32", "forward", medians)]) == []


def test_a_control_is_the_baseline_timed_again_right_after_it():
    def floor():
        return None

    cases = with_control({"a": print, FLOOR: floor, "b": len}, {FLOOR: "again"})
    assert list(cases) == ["a", FLOOR, "again", "b"]
    assert cases["again"] is floor
    with pytest.raises(ValueError, match="no case named 'clone' to control"):
        with_control(cases, {"clone": "clone again"})


def test_spread_is_how_far_a_baseline_landed_from_its_control():
    stats = {FLOOR: Stats(10.0, 9, 11, 9, 30.0, 5), "again": Stats(12.5, 9, 13, 9, 20.0, 5)}
    group = Group("rope", "t", stats, floor=FLOOR, controls={FLOOR: "again"})
    assert group.spread(FLOOR) == pytest.approx(1.25)  # symmetric: 12.5 / 10
    assert group.spread(FLOOR, worst=True) == pytest.approx(1.5)  # 30 / 20
    assert group.spread(CLONE) is None  # no control timed
    assert group.to_json()["controls"] == {FLOOR: "again"}


@pytest.mark.parametrize(
    "value,limit,at_most,spread,within",
    [
        (1.3, 1.2, True, 1.1, True),  # 1.3 <= 1.32
        (1.4, 1.2, True, 1.1, False),
        (0.95, 1.0, False, 1.1, True),  # 0.95 >= 0.909
        (0.8, 1.0, False, 1.1, False),
        (1.3, 1.2, True, None, None),
    ],
)
def test_a_miss_is_within_the_spread_only_up_to_the_widened_limit(
    value, limit, at_most, spread, within
):
    target = Target("g", "w", value, limit, at_most, spread)
    assert target.within_spread is within
    assert target.to_json()["within_spread"] is within


def test_rope_and_bias_targets_carry_their_baselines_spread(capsys):
    from rich.console import Console

    from posenc.bench.bias import BIAS_LIMITS, CORE_BASELINE, CORE_CONTROLS, bias_targets

    medians = {FLOOR: 10.0, CONTROLS[FLOOR]: 11.0, CLONE: 20.0, CONTROLS[CLONE]: 16.0}
    medians |= {HF_STYLE: 300.0, "apply_rope half": 25.0, "apply_rope_ half (in place)": 11.5}
    medians |= {"apply_rope intl": 21.0, "apply_rope_ intl (in place)": 10.0}
    group = _group([4, 16, 2048, 64], "float32", "forward", medians)
    group.controls = CONTROLS
    rope = {t.what: t for t in rope_targets([group])}
    assert rope["half: ÷ clone"].spread == pytest.approx(1.25)
    assert rope["half: ÷ clone"].within_spread  # 1.25 <= 1.2 * 1.25
    assert rope["half_: ÷ floor"].spread == pytest.approx(1.1)
    assert not rope["half_: ÷ floor"].met and rope["half_: ÷ floor"].within_spread
    assert rope["half: × faster"].spread is None
    stats = {
        CORE_BASELINE: Stats.of([0.010, 0.012]),
        CORE_CONTROLS[CORE_BASELINE]: Stats.of([0.011]),
    }
    stats |= {name: Stats.of([0.020, 0.030]) for name in BIAS_LIMITS}
    info = {"T": 8192, "core": True}
    core = Group("attention", "core", stats, CORE_BASELINE, info=info, controls=CORE_CONTROLS)
    bias = {t.what: t for t in bias_targets([core])}
    assert bias["t5: ÷ SDPA"].spread == pytest.approx(1.0)  # 11 ms and 11 ms
    assert bias["t5: ÷ SDPA (max)"].spread == pytest.approx(12 / 11)
    targets = [*rope.values(), *bias.values()]
    print_targets(Console(width=80), targets, quick=False)
    printed = capsys.readouterr().out
    assert max(len(line) for line in printed.splitlines()) <= 80 and "…" not in printed
    missed = [t for t in targets if not t.met]
    close = sum(bool(t.within_spread) for t in missed)
    assert f"{close} of the {len(missed)} missed by no more than the baseline's" in printed


def test_bf16_has_the_floor_targets_and_backward_its_copy_floor():
    medians = {FLOOR: 10.0, CLONE: 12.5, HF_STYLE: 300.0, BACKWARD_FLOOR: 20.0}
    for layout in ("half", "intl"):
        medians[f"apply_rope {layout}"] = 30.0
        medians[f"apply_rope_ {layout} (in place)"] = 11.0
    forward = _group([4, 16, 2048, 64], "bfloat16", "forward", medians)
    bf16 = {t.what for t in rope_targets([forward])}
    assert {"half: ÷ clone", "intl: ÷ clone (max)", "intl_: ÷ floor (max)"} <= bf16
    backward = _group([4, 16, 2048, 64], "float32", "forward+backward", medians)
    backward.floor = BACKWARD_FLOOR
    ratios = {t.what: t.value for t in rope_targets([backward])}
    assert ratios["half: ÷ floor"] == pytest.approx(1.5)
    assert not any("clone" in what or "_:" in what for what in ratios)


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--only", "nothing"], "--only: unknown suite 'nothing'; known: rope, additive"),
        (["--threads", "0"], "--threads: must be at least 1, got 0"),
        (["--repeats", "-1"], "--repeats: must be at least 1, got -1"),
        (["--load", "-2"], "--load: must be at least 0, got -2"),
        (["--load", "two"], "--load: expected a whole number, got 'two'"),
        (["--json", "/nonexistent-dir/x.json"], "does not exist"),
    ],
)
def test_bad_options_exit_2(argv, message, capsys):
    assert main(["bench", "--quick", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_every_option_has_help_and_a_metavar(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = capsys.readouterr().out
    for option in ("--only SUITES", "--threads N", "--repeats N", "--load N", "--json PATH"):
        assert option in text


def test_bias_targets_hold_each_encoding_to_its_limit():
    """Median and max ratios over causal SDPA at the target lengths, none at quick shapes."""
    from posenc.bench.bias import BIAS_LIMITS, CORE_BASELINE, bias_targets

    stats = {CORE_BASELINE: Stats.of([0.010, 0.012])}
    stats |= {name: Stats.of([0.020, 0.030]) for name in BIAS_LIMITS}
    core = Group("attention", "core", stats, floor=CORE_BASELINE, info={"T": 2048, "core": True})
    quick = Group("attention", "quick", stats, floor=CORE_BASELINE, info={"T": 64, "core": True})
    targets = {t.what: t for t in bias_targets([core, quick])}
    assert len(targets) == 2 * len(BIAS_LIMITS)
    median = targets["alibi: ÷ SDPA"]
    assert median.value == pytest.approx((20 / 10 + 30 / 12) / 2)  # per round: 2x, 2.5x
    assert median.limit == 1.5 and not median.met
    assert targets["fire: ÷ SDPA (max)"].met  # 30 / 12 = 2.5x <= 3x


@pytest.mark.parametrize("backward", [False, True])
def test_a_peer_case_calls_the_peer_once_per_q_and_k_pair(monkeypatch, backward):
    """transformers' case runs what its users run, ``apply_rotary_pos_emb(q, k, ...)``
    once (it rotated q and k twice when each was passed as both), and rotates each tensor
    as ``apply_rope`` does."""
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    from posenc.bench import rope as bench_rope

    calls = []
    original = llama.apply_rotary_pos_emb

    def counted(q, k, cos, sin, *args, **kwargs):
        calls.append(q.shape)
        return original(q, k, cos, sin, *args, **kwargs)

    monkeypatch.setattr(llama, "apply_rotary_pos_emb", counted)
    tensors = bench_rope._inputs((1, 2, 8, 16), torch.float64)
    build = bench_rope._backward_cases if backward else bench_rope._forward_cases
    cases = build(tensors)
    peer, ours = cases["HF apply_rotary_pos_emb"](), cases["apply_rope half"]()
    assert len(calls) == 1
    if not backward:  # (the backward cases' outputs are gradients of their own random grads)
        for got, want in zip(peer, ours, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_ratios_are_medians_of_the_ratio_in_each_round():
    """A slow stretch of the machine slows both cases of a round: the ratio within each
    round is 2 in four rounds of five, where the ratio of the medians says 8."""
    base = Stats.of([0.010, 0.010, 0.010, 0.040, 0.040])
    case = Stats.of([0.020, 0.020, 0.080, 0.080, 0.080])
    control = Stats.of([0.011, 0.010, 0.010, 0.044, 0.040])
    assert base.rounds_ms == pytest.approx((10.0, 10.0, 10.0, 40.0, 40.0))
    assert case.median_ms / base.median_ms == pytest.approx(8.0)
    assert median_ratio(case, base) == pytest.approx(2.0)
    group = Group("attention", "t", {FLOOR: base, "case": case, "again": control}, floor=FLOOR,
                  controls={FLOOR: "again"}, speedup_over=(FLOOR,))  # fmt: skip
    assert group.ratio_to_floor("case") == pytest.approx(2.0)
    assert group.speedup("case", FLOOR) == pytest.approx(0.5)
    assert group.spread(FLOOR) == pytest.approx(1.0)  # rounds 1 and 4 differ, the median not
    assert group.spread(FLOOR, worst=True) == pytest.approx(1.1)  # 44 / 40
    unpaired = Stats(20.0, 20.0, 20.0, 20.0, 20.0, 1)  # no rounds: the ratio of medians
    assert median_ratio(unpaired, base) == pytest.approx(2.0)


def test_keep_freed_memory_sets_glibc_thresholds_and_says_so(monkeypatch):
    """``--keep-freed-memory``: glibc's two thresholds set through ``mallopt`` (checked
    in a child process: the change lasts for the process), the record names the
    allocator; another C library gets a one-line error."""
    import platform
    import subprocess
    import sys

    from posenc.bench import allocator

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("glibc only")
    code = "from posenc.bench.allocator import keep_freed_memory as k; print(k())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert f"M_TRIM_THRESHOLD {allocator.TRIM_THRESHOLD}" in out.stdout
    assert f"M_MMAP_THRESHOLD {allocator.MMAP_THRESHOLD}" in out.stdout
    monkeypatch.setattr(allocator.platform, "libc_ver", lambda: ("musl", "1.2"))
    with pytest.raises(ValueError, match="glibc's malloc thresholds; found musl"):
        allocator.keep_freed_memory()
    results = run_benchmarks(only=["additive"], quick=True, repeats=1)
    assert results.settings["allocator"] == "C library defaults"
