"""The front door: `posenc` alone, `posenc help`, names, one error prefix, file errors.

An 80-column terminal is simulated with ``COLUMNS=80`` (rich and argparse read it).
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import re
from pathlib import Path

import pytest
import torch

import posenc
from posenc import cli
from posenc.cli import UsageError, error_line, main, resolve_name
from posenc.commands.list import COLUMNS, encoding_rows, markdown_table

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.fixture(autouse=True)
def _eighty_columns(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")


def run(capsys, *argv: str, status: int = 0) -> tuple[str, str]:
    assert main(list(argv)) == status, argv
    captured = capsys.readouterr()
    return captured.out, captured.err


def one_error_line(capsys, *argv: str) -> str:
    """Run a failing command; check it printed one prefixed line on stderr, no traceback."""
    out, err = run(capsys, *argv, status=2)
    assert out == "" and len(err.splitlines()) == 1, (argv, err)
    assert err.startswith(cli.PREFIX) and "Traceback" not in err, (argv, err)
    return err


# --------------------------------------------------------------------------- overview


@pytest.mark.parametrize("argv", [[], ["help"], ["HELP"]])
def test_bare_posenc_and_help_list_every_command_on_one_line(capsys, argv):
    out, err = run(capsys, *argv)
    assert err == ""
    lines = out.splitlines()
    commands = lines[lines.index("commands:") + 1 : lines.index("options:") - 1]
    assert [line.split()[0] for line in commands] == [*cli.COMMANDS, "help"], out
    for line in commands:  # one line each: name, then its description
        assert line.startswith("  ") and len(line.split()) > 2, line
    assert max(map(len, lines)) <= 80


def test_help_of_one_command_and_unknown_command_suggests(capsys):
    with pytest.raises(SystemExit) as done:
        main(["help", "explain"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith("usage: posenc explain")
    err = one_error_line(capsys, "lsit")
    assert "unknown command 'lsit'; did you mean 'list'?" in err
    assert "did you mean 'explain'" in one_error_line(capsys, "help", "explian")


def test_names_are_case_insensitive_where_unambiguous(capsys, tmp_path):
    out, _ = run(capsys, "explain", "ALiBi")
    assert "Press et al. 2022" in out
    out, _ = run(capsys, "SHOW", "Rope-Rotation", "--out", str(tmp_path / "r.svg"))
    assert (tmp_path / "r.svg").is_file()
    assert resolve_name("Rope", ["rope", "alibi"], what="encoding") == "rope"
    with pytest.raises(UsageError, match="unknown encoding 'X'"):
        resolve_name("X", ["a", "b"], what="encoding")
    with pytest.raises(UsageError, match="unknown encoding 'ab'"):
        resolve_name("ab", ["Ab", "aB"], what="encoding")  # ambiguous: never guessed


@pytest.mark.parametrize(
    ("argv", "suggestion"),
    [
        (["explain", "alibl"], "'alibi'"),
        (["explain", "sinusodial"], "'sinusoidal'"),
        (["show", "rope-spectrm"], "'rope-spectrum'"),
        (["show", "atention"], "'attention'"),
    ],
)
def test_unknown_names_suggest_the_closest(capsys, argv, suggestion):
    assert f"did you mean {suggestion}?" in one_error_line(capsys, *argv)


@pytest.mark.parametrize(
    "argv",
    [
        ["nosuch"],
        ["list", "--bogus"],
        ["explain"],
        ["explain", "rope", "--dim", "7"],
        ["show"],
        ["show", "rope", "--dpi", "zero"],
        ["lab", "--task", "nosuch"],
        ["lab", "--eval-lens", "abc"],
        ["bench", "--only", "nosuch"],
    ],
)
def test_every_command_uses_one_error_prefix(capsys, argv):
    err = one_error_line(capsys, *argv)
    assert not re.match(r"posenc: error: posenc", err), err


def test_every_option_has_help_and_a_metavar():
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert set(cli.COMMANDS) <= set(sub.choices)
    for name in cli.COMMANDS:
        for action in sub.choices[name]._actions:
            assert action.help, (name, action.option_strings or action.dest)
            if action.nargs != 0 and not action.choices:  # a value: its metavar names it
                assert action.metavar and action.metavar.isupper(), (name, action.dest)


# --------------------------------------------------------------------------- posenc list


def test_list_fits_80_columns_with_the_readme_columns(capsys):
    out, _ = run(capsys, "list")
    lines = out.splitlines()
    assert max(map(len, lines)) <= 80
    header = next(line for line in lines if line.split()[:1] == ["name"])
    assert re.split(r"\s{2,}", header.strip()) == list(COLUMNS)
    first_cells = {line.split()[0] for line in lines if line.strip()}
    assert set(posenc.available()) <= first_cells


def test_readme_encodings_table_is_posenc_list(capsys):
    out, _ = run(capsys, "list", "--markdown")
    assert out == markdown_table() + "\n"
    assert markdown_table() in README.read_text(encoding="utf-8"), (
        "README's encodings table differs from `posenc list --markdown`: paste its output"
    )
    names = [row[0] for row in encoding_rows()]
    assert names == posenc.available()


def test_list_models_fits_80_columns_with_each_family_and_its_scheme(capsys):
    from posenc.hf.families import FAMILIES

    lines = run(capsys, "list", "--models")[0].splitlines()
    assert max(map(len, lines)) <= 80
    rows = {line.split()[0]: line for line in lines if line.startswith(" ") and line.strip()}
    assert set(FAMILIES) <= set(rows)
    schemes = {"qwen2_vl": "mrope", "pixtral": "axial_alternating", "ministral3": "temperature"}
    for model_type, scheme in schemes.items():
        assert scheme in rows[model_type].split(), (model_type, rows[model_type])


def test_list_json_has_every_field_in_full(capsys):
    entries = json.loads(run(capsys, "list", "--json")[0])
    assert [e["name"] for e in entries] == posenc.available()
    for entry in entries:
        info = posenc.info(entry["name"])
        assert entry["paper"] == info.paper and entry["description"] == info.description
        assert entry["sites"] == info.sites.names()
        assert entry["positions"] == info.position_shape
    shapes = {e["name"]: e["positions"] for e in entries}
    assert shapes["rope"] == "[T]" and shapes["mrope"] == "[A, T]"
    assert shapes["axial_rope"] == "[N, A]"


# --------------------------------------------------------------------------- explain


def test_explain_says_when_an_untrained_bias_is_zero(capsys):
    out, _ = run(capsys, "explain", "cope")
    assert "Untrained, this bias is exactly zero" in out
    assert "0.000 │ 0.000" not in out  # no table of zeros


@pytest.mark.parametrize("name", ["sinusoidal", "rope", "alibi", "shaw", "t5"])
def test_explain_prints_no_negative_zero_and_whole_titles(capsys, name):
    out, _ = run(capsys, "explain", name)
    assert not re.search(r"-0\.0+(?![0-9])", out), name
    assert max(map(len, out.splitlines())) <= 80
    for title in ("Bias of head 0 (query row, key column; · = masked)",
                  "Last query (19): bias at distance d, and the attention the bias alone gives",
                  "Rotated dot product q_m . k_n against the offset m - n (random q, k; seed 0)",
                  "Relative position: PE[p+k] from PE[p]"):  # fmt: skip
        first_words = " ".join(title.split()[:4])
        if first_words in out:
            assert any(line.strip() == title for line in out.splitlines()), title


# --------------------------------------------------------------------------- file errors


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (errno.ENOSPC, "disk full"),
        (errno.EACCES, "permission denied"),
        (errno.EROFS, "read-only file system"),
        (errno.ENOENT, "no such file or directory"),
    ],
)
def test_file_system_errors_name_the_path(capsys, monkeypatch, tmp_path, code, words):
    def refuse(src, dst):
        raise OSError(code, os.strerror(code), src)

    monkeypatch.setattr(os, "replace", refuse)
    target = tmp_path / "fig.svg"
    err = one_error_line(capsys, "show", "rope-rotation", "--out", str(target))
    assert err == f"posenc: error: {str(target)!r}: {words}\n"
    assert list(tmp_path.iterdir()) == [], "a failed write left a file behind"


def test_paths_under_proc_and_error_line_forms(capsys, tmp_path):
    err = one_error_line(capsys, "show", "rope-rotation", "--out", "/proc/posenc-test/x.svg")
    assert "'/proc/posenc-test" in err
    err = one_error_line(capsys, "show", "rope-rotation", "--out", "/proc/x.svg")
    assert "'/proc/x.svg'" in err
    err = one_error_line(capsys, "show", "learned", "--table", "/proc/self/mem")
    assert err.startswith("posenc: error: '/proc/self/mem': ")
    assert one_error_line(capsys, "show", "learned", "--table", str(tmp_path)).endswith(
        "is a directory\n"
    )
    (tmp_path / "file").write_text("x", encoding="utf-8")
    err = one_error_line(capsys, "show", "--all", "--out", str(tmp_path / "file"))
    assert err == f"posenc: error: {str(tmp_path / 'file')!r}: not a directory\n"
    renamed = OSError(errno.EXDEV, "Invalid cross-device link", "a", None, "b")
    assert error_line(renamed) == "posenc: error: 'a' -> 'b': invalid cross-device link"
    assert error_line(OSError(errno.ENOSPC, "x")) == "posenc: error: disk full"
    assert error_line(ValueError("two\nlines")) == "posenc: error: two lines"


def test_show_table_rejects_files_that_are_not_tables_in_one_line(capsys, tmp_path):
    (tmp_path / "text.pt").write_text("hello\n", encoding="utf-8")
    (tmp_path / "data.json").write_text(json.dumps({"pos": [[1.0]]}), encoding="utf-8")
    (tmp_path / "empty.pt").write_bytes(b"")
    (tmp_path / "plain.pkl").write_bytes(pickle.dumps({"pos": [[1.0, 2.0]]}))
    torch.save({"weight": torch.zeros(3)}, tmp_path / "vector.pt")
    torch.save(["not", "a", "table"], tmp_path / "list.pt")
    for name in ("text.pt", "data.json", "empty.pt", "plain.pkl", "vector.pt", "list.pt"):
        out = tmp_path / "out" / "x.png"
        err = one_error_line(capsys, "show", "learned", "--table", str(tmp_path / name),
                             "--out", str(out))  # fmt: skip
        assert name in err and "weights_only=False" not in err, err
        assert not out.exists()
