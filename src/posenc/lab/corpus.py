"""Byte-level text corpora that need no download.

Two named corpora exist offline on a stock machine:

* ``stdlib`` (the default): the running Python's own standard library, the ``*.py`` files
  directly under ``sysconfig.get_paths()["stdlib"]`` (code);
* ``fortunes``: English prose, the fortune-cookie collections of Debian's ``fortunes``
  package (quotations, definitions, poems, jokes; about 2.6 MB in 43 files), the plain
  files of ``/usr/share/games/fortunes`` (``scripts/setup.sh`` installs the package).

Files are sorted by name, every tenth file (index ``% 10 == 5``) held out for
evaluation, the rest for training. Any UTF-8 text file or folder can replace them
(``--corpus PATH``): a folder is split by file the same way when it has at least two
files, a single file by bytes (the last tenth held out). Held-out files that repeat the
training text are dropped and the overlap of the rest is measured
(``posenc.lab.heldout``).

Tokens are bytes (vocabulary 256); a ``Corpus`` holds ``uint8`` tensors and records
which files it read and the sha256 of their names and contents, so a result names its
data exactly.
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from posenc.lab.heldout import clean_split
from posenc.lab.results import read_regular

__all__ = ["CORPORA", "FORTUNES", "HELD_OUT_EVERY", "Corpus", "load_corpus", "stdlib_corpus"]

#: One file in this many is held out (by sorted index).
HELD_OUT_EVERY = 10
#: Where Debian's ``fortunes`` package puts its collections.
FORTUNES = Path("/usr/share/games/fortunes")
#: The named corpora ``--corpus`` accepts besides a path.
CORPORA = ("stdlib", "fortunes")
_SEPARATOR = b"\n"


@dataclass(frozen=True)
class Corpus:
    """Training and held-out bytes with their provenance.

    Attributes:
        train: training bytes ``[N]`` (uint8).
        heldout: held-out bytes ``[M]`` (uint8).
        source: where the text came from (``"stdlib"`` or the given path).
        root: the folder file names are relative to.
        train_files: training file names, in order.
        heldout_files: held-out file names, in order.
        sha256: hash of every file name and content, in order.
        heldout_bounds: ``(start, end)`` of each held-out file in ``heldout``.
        cleanliness: the overlap record of ``posenc.lab.heldout.clean_split``.
    """

    train: Tensor
    heldout: Tensor
    source: str
    root: str
    train_files: tuple[str, ...]
    heldout_files: tuple[str, ...]
    sha256: str
    heldout_bounds: tuple[tuple[int, int], ...]
    cleanliness: dict[str, object]

    def describe(self) -> dict[str, object]:
        """JSON-ready provenance: files, sizes and hash (not the bytes)."""
        return {
            "source": self.source,
            "root": self.root,
            "sha256": self.sha256,
            "train_bytes": int(self.train.numel()),
            "heldout_bytes": int(self.heldout.numel()),
            "train_files": list(self.train_files),
            "heldout_files": list(self.heldout_files),
            "heldout": self.cleanliness,
        }


def stdlib_corpus() -> Corpus:
    """The standard library's top-level ``*.py`` sources on this machine.

    Raises:
        ValueError: the standard library folder holds fewer than two Python files.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py") if p.is_file())
    if len(files) < 2:
        raise ValueError(f"the standard library folder {root} holds {len(files)} Python files")
    return _from_files(root, files, source="stdlib")


def fortunes_corpus(root: Path = FORTUNES) -> Corpus:
    """English prose: the plain collections of Debian's ``fortunes`` package.

    Only regular files without a suffix are read (the package also holds ``.dat``
    indexes and ``.u8`` links to the same texts).

    Raises:
        ValueError: the package is not installed (the message says how to install it).
    """
    files = sorted(p for p in root.glob("*") if p.is_file() and not p.is_symlink() and not p.suffix)
    if len(files) < 2:
        raise ValueError(
            f"corpus 'fortunes' needs Debian's fortunes package in {str(root)!r}: "
            "run `apt-get install fortunes` (or bash scripts/setup.sh)"
        )
    return _from_files(root, files, source="fortunes")


def load_corpus(path: str | Path | None) -> Corpus:
    """Load a named corpus (``CORPORA``), ``path`` (a UTF-8 text file or a folder of
    them), or the stdlib when ``None``.

    In a folder, hidden entries are skipped; every other file must be UTF-8 text.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: the text is empty, a file is not UTF-8, or a name is both a named
            corpus and an existing path.
    """
    if path is None or path == "stdlib":
        _check_unambiguous(path)
        return stdlib_corpus()
    if path == "fortunes":
        _check_unambiguous(path)
        return fortunes_corpus()
    root = Path(path)
    if not root.exists():
        raise FileNotFoundError(f"corpus {str(root)!r} does not exist")
    if root.is_file():
        return _from_files(root.parent, [root], source=str(root))
    files = sorted(
        p
        for p in root.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
    )
    if not files:
        raise ValueError(f"corpus folder {str(root)!r} holds no files")
    return _from_files(root, files, source=str(root))


def _check_unambiguous(name: str | None) -> None:
    if name is not None and Path(name).exists():
        raise ValueError(
            f"--corpus {name!r} is both a named corpus and a path here; for the path write ./{name}"
        )


def _read_text(path: Path) -> bytes:
    data = read_regular(path)
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"corpus file {str(path)!r} is not UTF-8 text ({exc.reason})") from None
    return data


def _from_files(root: Path, files: list[Path], *, source: str) -> Corpus:
    digest = hashlib.sha256()
    contents = []
    for path in files:
        data = _read_text(path)
        name = path.relative_to(root).as_posix()
        digest.update(name.encode() + b"\0" + data + b"\0")
        contents.append((name, data))
    if sum(len(data) for _, data in contents) == 0:
        raise ValueError(f"corpus {source!r} is empty")
    if len(contents) >= 2:
        held = {i for i in range(len(contents)) if i % HELD_OUT_EVERY == HELD_OUT_EVERY // 2}
        held = held or {len(contents) - 1}
        train = [c for i, c in enumerate(contents) if i not in held]
        heldout, cleanliness = clean_split(train, [c for i, c in enumerate(contents) if i in held])
        train_bytes = _SEPARATOR.join(data for _, data in train)
    else:
        name, data = contents[0]
        cut = len(data) - len(data) // HELD_OUT_EVERY
        train, heldout = contents, [(name, data[cut:])]
        train_bytes = data[:cut]
        cleanliness = clean_split([(name, train_bytes)], heldout, drop=False)[1]
    bounds, start = [], 0
    for _, data in heldout:
        bounds.append((start, start + len(data)))
        start += len(data) + len(_SEPARATOR)
    return Corpus(
        train=_as_tensor(train_bytes),
        heldout=_as_tensor(_SEPARATOR.join(data for _, data in heldout)),
        source=source,
        root=str(root),
        train_files=tuple(name for name, _ in train),
        heldout_files=tuple(name for name, _ in heldout),
        sha256=digest.hexdigest(),
        heldout_bounds=tuple(bounds),
        cleanliness=cleanliness,
    )


def _as_tensor(data: bytes) -> Tensor:
    if not data:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)
