"""Sweeps as files: ``posenc lab --config sweep.toml``.

A sweep file holds any ``posenc lab`` option by its long name (``train-len`` or
``train_len``), lists where the option takes several values (``encodings``, ``seeds``,
``eval-lens``, ``scalings``, ``finetune-scalings``), ``seeds`` also as a count, and any
number of ``[[settings]]`` tables, each with a ``name`` and options that override the top
level for one sub-sweep written to ``<out>/<name>``::

    encodings = ["rope", "t5"]
    seeds = [0, 1, 2]
    steps = 350

    [[settings]]
    name = "t5-64"
    t5-max-distance = 64

    [[settings]]
    name = "t5-128"
    t5-max-distance = 128

Options given on the command line win over the file. The file is saved as
``sweep.toml`` beside the results, so ``posenc lab --config <out>/sweep.toml --out <new>``
repeats the sweep (bit for bit on the same machine, with the same thread count).

posenc ships sweeps of its own in ``posenc/lab/sweeps/``, named by their file stem:
``posenc lab --config positions`` reads ``positions.toml`` there unless a file of that
name exists in the working folder (``shipped_sweeps`` lists them).
"""

from __future__ import annotations

import re
import stat
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from posenc.lab.config import PROFILES, TASKS
from posenc.lab.precision import PRECISIONS
from posenc.lab.results import read_regular

__all__ = [
    "CHOICES",
    "OPTIONS",
    "SHIPPED",
    "Setting",
    "load_sweep",
    "resolve_sweep",
    "shipped_sweeps",
]

#: Sweep-file key -> (argparse destination, expected type). Lists are of that type.
OPTIONS: dict[str, tuple[str, type | tuple[type, ...]]] = {
    "encodings": ("encodings", list),
    "task": ("task", str),
    "corpus": ("corpus", str),
    "train_len": ("train_len", int),
    "eval_lens": ("eval_lens", list),
    "steps": ("steps", int),
    "max_steps": ("max_steps", int),
    "batch_size": ("batch_size", int),
    "lr": ("lr", (int, float)),
    "warmup": ("warmup", int),
    "d_model": ("d_model", int),
    "layers": ("num_layers", int),
    "heads": ("num_heads", int),
    "eval_tokens": ("eval_tokens", int),
    "eval_examples": ("eval_examples", int),
    "eval_stride": ("eval_stride", int),
    "precision": ("precision", str),
    "finetune_steps": ("finetune_steps", int),
    "finetune_len": ("finetune_len", int),
    "finetune_scalings": ("finetune_scalings", list),
    "learned_beyond": ("learned_beyond", str),
    "scalings": ("scalings", list),
    "dynamic_factor": ("dynamic_factor", (int, float)),
    "t5_max_distance": ("t5_max_distance", int),
    "val_every": ("val_every", int),
    "val_tokens": ("val_tokens", int),
    "plateau": ("plateau", int),
    "plateau_eps": ("plateau_eps", (int, float)),
    "profile": ("profile", str),
    "passkey_key_len": ("passkey_key_len", int),
    "seeds": ("seeds", (int, list)),
    "seed": ("seed", int),
    "quick": ("quick", bool),
    "out": ("out", str),
    "threads": ("threads", int),
    "jobs": ("jobs", int),
    "device": ("device", str),
    "no_progress": ("no_progress", bool),
}
#: The options whose values come from a fixed set (the command line's choices; ``task``
#: also ``lm``, text, the default).
CHOICES: dict[str, tuple[str, ...]] = {"task": TASKS, "profile": PROFILES, "precision": PRECISIONS}
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
#: The folder of the sweeps shipped with posenc.
SHIPPED = Path(__file__).with_name("sweeps")

Setting = tuple[str | None, dict[str, object]]


def _options(table: dict, where: str) -> dict[str, object]:
    out = {}
    for key, value in table.items():
        norm = key.replace("-", "_")
        if norm not in OPTIONS:
            known = ", ".join(k.replace("_", "-") for k in OPTIONS)
            raise ValueError(f"{where}: unknown option {key!r}; known: {known}")
        dest, kind = OPTIONS[norm]
        if isinstance(value, bool) != (kind is bool) or not isinstance(value, kind):
            want = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
            raise ValueError(f"{where}: option {key!r} must be {want}, got {value!r}")
        if norm in CHOICES and value not in CHOICES[norm]:
            raise ValueError(
                f"{where}: option {key!r} must be one of {', '.join(CHOICES[norm])}, got {value!r}"
            )
        out[dest] = value
    return out


def shipped_sweeps() -> list[str]:
    """Names of the sweeps shipped with posenc (``posenc lab --config NAME``), sorted."""
    return sorted(p.stem for p in SHIPPED.glob("*.toml"))


def resolve_sweep(path: str | Path) -> Path:
    """``path`` itself when it exists, else the shipped sweep of that name.

    Raises:
        FileNotFoundError: neither (the message lists the shipped sweeps).
    """
    path = Path(path)
    if path.exists() or path.is_symlink():
        return path
    named = _NAME.fullmatch(str(path)) and path.suffix in ("", ".toml")
    if named and path.stem in shipped_sweeps():
        return SHIPPED / f"{path.stem}.toml"
    raise FileNotFoundError(
        f"no sweep file {str(path)!r} and no shipped sweep of that name "
        f"(shipped: {', '.join(shipped_sweeps())})"
    )


def load_sweep(path: str | Path) -> tuple[str, list[Setting]]:
    """Read a sweep file: its text and one ``(name, options)`` per setting (a single
    ``(None, options)`` without ``[[settings]]``), options keyed by argparse destination.

    The file is UTF-8, with or without a byte-order mark; ``path`` may also name a
    shipped sweep (``resolve_sweep``).

    Raises:
        FileNotFoundError: no such file and no such shipped sweep.
        ValueError: not a regular file (a FIFO or a device is never opened), not UTF-8,
            not TOML or nested too deeply, an unknown option, a value of the wrong type
            or outside its ``CHOICES``, or settings without a unique file-name-safe
            ``name`` (the message names the file).
    """
    path = resolve_sweep(path)
    if not stat.S_ISREG(path.stat().st_mode):
        raise ValueError(f"sweep file {str(path)!r} is not a regular file")
    try:
        text = read_regular(path).decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"sweep file {str(path)!r} is not UTF-8 text (byte {exc.start}: {exc.reason})"
        ) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"sweep file {str(path)!r} is not valid TOML: {exc}") from None
    except RecursionError:
        raise ValueError(f"sweep file {str(path)!r} nests too deeply") from None
    settings = data.pop("settings", None)
    top = _options(data, f"sweep file {str(path)!r}")
    if settings is None:
        return text, [(None, top)]
    if not isinstance(settings, list) or not settings:
        raise ValueError(f"sweep file {str(path)!r}: settings must be [[settings]] tables")
    out: list[Setting] = []
    for index, table in enumerate(settings):
        where = f"sweep file {str(path)!r}, settings #{index + 1}"
        name = table.pop("name", None) if isinstance(table, dict) else None
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(f"{where}: needs a name of letters, digits, '.', '-' or '_'")
        if name in (n for n, _ in out):
            raise ValueError(f"{where}: the name {name!r} is repeated")
        out.append((name, {**top, **_options(table, where)}))
    return text, out
