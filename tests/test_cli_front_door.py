"""The command line's front door II: statements the numbers back, bounded work, flags
named in one short line, did-you-mean for options and names, no folders created.

An 80-column terminal is simulated with ``COLUMNS=80`` (rich and argparse read it).
"""

from __future__ import annotations

import re
import resource
import subprocess
import sys

import pytest

from posenc import cli
from posenc.cli import main
from posenc.commands import bench as bench_command
from posenc.explain import MAX_LENGTH


@pytest.fixture(autouse=True)
def _eighty_columns(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")


def _error(capsys, *argv: str, short: bool = True) -> str:
    """Run a failing command: one prefixed line, exit 2; under 100 characters unless it
    quotes a path of the user's (``short=False``)."""
    assert main(list(argv)) == 2, argv
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1, (argv, err)
    assert err.startswith(cli.PREFIX), (argv, err)
    assert not short or len(err.rstrip("\n")) < cli.LINE_LIMIT, (argv, err)
    return err


def _scores(out: str) -> list[list[float]]:
    """The rows of the rotated dot-product table: the scores at each start n."""
    rows = []
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip("│┃ ").split("│")]
        if len(cells) > 2 and cells[0].isdigit():
            rows.append([float(c) for c in cells[1:-1]])
    return rows


@pytest.mark.parametrize("name", ["rope", "temperature", "xpos"])
def test_explain_says_only_m_minus_n_matters_exactly_when_its_numbers_agree(capsys, name):
    assert main(["explain", name]) == 0
    out = capsys.readouterr().out
    rows = _scores(out)
    assert rows and all(len(r) == 4 for r in rows), out
    printed_equal = all(len(set(r)) == 1 for r in rows)  # every column, 4 decimals
    claims = "only m - n matters" in " ".join(out.split())
    assert claims == printed_equal, (name, rows)
    assert printed_equal == (name != "temperature")


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["explain", "alibi", "--len", "100000"], "--len"),
        (["explain", "rope", "--len", "1000000"], "--len"),
        (["explain", "learned", "--dim", "100000"], "--dim"),
        (["explain", "alibi", "--heads", "1000"], "--heads"),
        (["explain", "rope", "--dim", "7"], "--dim"),
        (["show", "sinusoidal", "--dpi", "100000"], "--dpi"),
        (["show", "similarity", "--len", "1000000"], "--len"),
        (["show", "rope-spectrum", "--len", "2048"], "--len"),
        (["show", "rope-rotation", "--dim", "8"], "--dim"),
        (["show", "alibi", "--table", "x.pt"], "--table"),
        (["explain", "rope", "--heads", "8"], "--heads"),
        (["explain", "alibi", "--dim", "64"], "--dim"),
        (["lab", "--train-len", "0"], "--train-len"),
        (["lab", "--layers", "0"], "--layers"),
        (["lab", "--d-model", "30"], "--heads"),
        (["lab", "--batch-size", "0"], "--batch-size"),
        (["lab", "--lr", "-1"], "--lr"),
        (["lab", "--precision", "half"], "--precision"),
    ],
)
def test_bad_values_name_the_flag_in_one_short_line(capsys, argv, flag):
    err = _error(capsys, *argv)
    assert flag in err, err
    assert not re.search(r"\b(train_len|num_layers|num_heads|batch_size|d_model)\b", err), err


@pytest.mark.parametrize(
    ("argv", "suggestion"),
    [
        (["show", "rope-spectrum", "--lenn", "5"], "'--len'"),
        (["explain", "rope", "--dimm", "4"], "'--dim'"),
        (["lab", "--encodings", "rop,alibi"], "'rope'"),
        (["lab", "--encodings", "alibi", "sinusodial"], "'sinusoidal'"),
        (["bench", "--only", "rop"], "'rope'"),
        (["lab", "--task", "cpy"], "'copy'"),
        (["lab", "--device", "gpu"], "'cpu'"),
        (["explain", "alibl"], "'alibi'"),
    ],
)
def test_options_and_names_get_did_you_mean(capsys, argv, suggestion):
    assert f"did you mean {suggestion}?" in _error(capsys, *argv)


def test_unknown_names_without_a_close_one_stay_short(capsys):
    err = _error(capsys, "lab", "--encodings", "nonesuch")
    assert "unknown encoding 'nonesuch'" in err and "posenc list" in err
    assert "unknown option '--frobnicate'" in _error(capsys, "list", "--frobnicate")


def test_out_in_a_missing_folder_is_refused_and_not_created(capsys, tmp_path):
    missing = tmp_path / "missing" / "deeper"
    for argv in (["rope-rotation", "--out", missing / "x.svg"], ["--all", "--out", missing]):
        assert "no such file or directory" in _error(capsys, "show", *map(str, argv), short=False)
    assert not (tmp_path / "missing").exists()


def test_explain_at_the_largest_length_does_not_build_the_full_bias():
    """Peak memory of ``explain alibi --len MAX_LENGTH``: the full [H, L, L] bias in float64
    alone would be 4 x 4096^2 x 8 bytes = 512 MiB over the interpreter and torch."""
    code = (
        "import resource, sys\n"
        "from posenc.cli import main\n"
        "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        f"assert main(['explain', 'alibi', '--len', '{MAX_LENGTH}']) == 0\n"
        "peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "print('GROWTH', (peak - base) * 1024, file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    growth = int(done.stderr.split("GROWTH")[-1])
    assert growth < 256 << 20, growth
    assert resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss > 0


def test_bench_quick_says_its_ratios_are_not_meaningful(capsys):
    assert main(["bench", "--quick", "--only", "additive", "--repeats", "1"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert bench_command.QUICK_NOTE in out
