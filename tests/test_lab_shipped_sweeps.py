"""The sweeps shipped with posenc: each loads by name, names registered encodings, and a
file of the same name in the working folder wins."""

from __future__ import annotations

import pytest

from posenc import cli
from posenc.base import available
from posenc.lab.config import LabConfig
from posenc.lab.sweepfile import load_sweep, resolve_sweep, shipped_sweeps


def test_positions_is_shipped_with_the_papers_encodings_and_three_seeds():
    assert "positions" in shipped_sweeps()
    _, [(name, options)] = load_sweep("positions")
    assert name is None and options["seeds"] == [0, 1, 2]
    wanted = {"rope", "alibi", "p_rope", "fox", "stick_breaking", "path", "fope"}
    assert set(options["encodings"]) == wanted


@pytest.mark.parametrize("name", shipped_sweeps())
def test_every_shipped_sweep_builds_a_config(name):
    _, settings = load_sweep(name)
    for _, options in settings:
        known = tuple(e for e in options["encodings"] if e in available())
        LabConfig(encodings=known, seeds=tuple(options["seeds"]))  # raises if invalid


def test_a_local_file_wins_over_a_shipped_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "positions").write_text("steps = 7\n")
    assert resolve_sweep("positions").resolve() == (tmp_path / "positions").resolve()
    assert load_sweep("positions")[1] == [(None, {"steps": 7})]


def test_an_unknown_name_lists_the_shipped_ones(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"shipped: .*positions"):
        load_sweep("no-such-sweep")
    assert cli.main(["lab", "--config", "no-such-sweep"]) == 2
    err = capsys.readouterr().err.strip()
    assert "no-such-sweep" in err and len(err.splitlines()) == 1
