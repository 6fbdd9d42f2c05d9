"""The documentation: the site builds strictly, and its examples run or parse as written.

* ``mkdocs build --strict`` (skipped without the ``docs`` extra): broken links, missing
  anchors and docstrings mkdocstrings cannot read fail the build, and every public name of
  ``posenc`` and ``posenc.hf`` (their ``__all__``) has its heading in the API reference.
* every ```python block of ``docs/*.md`` runs, in order, per page (as the README's do in
  ``tests/test_readme.py``);
* every ``posenc ...`` line of a ```bash block in the docs and the README is accepted by
  the command line's parser (the commands are not run: ``posenc lab`` takes minutes);
* numbers the docs quote from a command equal what that command prints.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from posenc.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs").glob("*.md"))
DOCS_DEPS = ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python")


def blocks(path: Path, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", path.read_text(encoding="utf-8"), re.S)


def command_lines(path: Path) -> list[list[str]]:
    """The ``posenc`` invocations of the bash blocks of ``path``, as argument lists."""
    found = []
    for block in blocks(path, "bash"):
        for line in block.replace("\\\n", " ").splitlines():  # join continued lines
            for part in line.split("&&"):
                words = shlex.split(part, comments=True)
                if words[:1] == ["posenc"]:
                    found.append(words[1:])
    return found


@pytest.mark.skipif(
    any(importlib.util.find_spec(m.split(".")[0]) is None for m in DOCS_DEPS),
    reason="the docs extra is not installed (pip install -e '.[docs]')",
)
def test_site_builds_strictly(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    import posenc.hf

    for module, page in ((posenc, "api/index.html"), (posenc.hf, "api/hf/index.html")):
        anchors = re.findall(r'id="([\w.]+)"', (tmp_path / page).read_text(encoding="utf-8"))
        prefix = re.escape(module.__name__)
        for name in module.__all__:  # a heading of its own, here or in one of its modules
            pattern = rf"{prefix}\.(\w+\.)?{re.escape(name)}"
            assert any(re.fullmatch(pattern, a) for a in anchors), f"{page} lacks {name}"


@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p, "python")], ids=lambda p: p.name)
def test_python_examples_in_the_docs_run(page):
    namespace: dict[str, object] = {}
    for i, block in enumerate(blocks(page, "python")):
        exec(compile(block, f"{page.name} python block {i}", "exec"), namespace)


@pytest.mark.parametrize("page", [*PAGES, ROOT / "README.md"], ids=lambda p: p.name)
def test_commands_in_the_docs_parse(page):
    for argv in command_lines(page):
        if argv[:1] == ["help"] or not argv:
            continue
        build_parser().parse_args(argv)  # raises UsageError on an unknown command or option


def test_choosing_quotes_explain_alibi_as_printed(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    page = (ROOT / "docs" / "choosing.md").read_text(encoding="utf-8")
    quote = re.search(
        r"`posenc explain alibi --len 12` prints.*?head 0 of 4 gives (\d+) % to the current "
        r"token and (\d+) % at\s+distance 8 of 12",
        page,
        re.S,
    )
    assert quote, "choosing.md no longer quotes `posenc explain alibi --len 12`"
    assert main(["explain", "alibi", "--len", "12"]) == 0
    lines = capsys.readouterr().out.splitlines()
    row = next(line for line in lines if line.strip("│ ").startswith("0 attn"))
    percents = [float(v) for v in re.findall(r"([\d.]+)%", row)]  # d = 0, 1, 2, 4, 8
    assert [round(percents[0]), round(percents[4])] == [int(quote[1]), int(quote[2])]


def test_gallery_numbers_of_the_trained_table():
    from posenc.analysis import cosine_similarity_matrix
    from posenc.viz import load_table

    table = load_table(ROOT / "docs" / "figures" / "learned_trained_table.pt")
    page = (ROOT / "docs" / "gallery.md").read_text(encoding="utf-8")
    cos = cosine_similarity_matrix(table)
    neighbours = float(np.mean(np.diagonal(cos, 1)))
    assert table.shape == (64, 96) and "64 x 96" in page
    assert f"a standard deviation of {table.std():.2f}" in page
    assert f"(mean cosine {neighbours:.2f} between `p` and `p + 1`)" in page
