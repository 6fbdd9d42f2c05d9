"""Shared plumbing of the figures: figure creation, saving, and table loading.

Shapes: ``L`` positions, ``C`` d_model. Figures are plain ``matplotlib.figure.Figure``
objects, never created through ``pyplot``: no global state and no interactive backend,
so everything runs headless (``savefig`` picks the Agg or SVG renderer from the file
suffix). matplotlib is imported inside the functions, so ``import posenc.viz`` is cheap.
"""

from __future__ import annotations

import errno
import io
import os
import pickle
import tempfile
import warnings
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from posenc._checks import check_int
from posenc.base import PositionalEncoding, Site, available, build
from posenc.palette import ENCODING_STYLES

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

FORMATS = (".png", ".svg")

#: The model shape every figure builds its encodings with unless told otherwise.
DEFAULT_SHAPE = {"d_model": 128, "num_heads": 4, "head_dim": 32, "max_len": 100}


def new_figure(width: float, height: float) -> Figure:
    """A headless figure of ``width x height`` inches with constrained layout."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def figure_path(path: str | Path) -> Path:
    """``path`` as a ``Path`` after checking its suffix is ``.png`` or ``.svg``.

    Raises:
        ValueError: another suffix.
    """
    path = Path(path)
    if path.suffix.lower() not in FORMATS:
        raise ValueError(f"cannot write {str(path)!r}: the suffix must be one of {FORMATS}")
    return path


def save_figure(fig: Figure, path: str | Path, *, dpi: int = 100) -> Path:
    """Write ``fig`` to ``path`` (``.png`` or ``.svg``, chosen by the suffix).

    SVGs keep their text as ``<text>`` elements and carry no date, so regenerating a
    figure gives the same file; PNGs are written as optimised RGB. The file is rendered in
    memory and then replaces ``path`` atomically: an interrupted or failed write (disk
    full) never leaves a partial figure.

    Raises:
        ValueError: an unsupported suffix or a non-positive ``dpi``.
        OSError: the folder does not exist (it is not created: a missing folder is
            more often a typo than a wish) or cannot be written (the error names the path).
    """
    import matplotlib

    path = figure_path(path)
    dpi = check_int("dpi", dpi)
    if not path.parent.is_dir():
        raise FileNotFoundError(errno.ENOENT, "no such folder", str(path.parent))
    buffer = io.BytesIO()
    if path.suffix.lower() == ".svg":
        with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "posenc"}):
            fig.savefig(buffer, format="svg", dpi=dpi, metadata={"Date": None})
    else:  # RGB (the figures are opaque) and optimised: about 10% smaller than RGBA
        from PIL import Image

        fig.savefig(buffer, format="png", dpi=dpi)
        rgb = Image.open(buffer).convert("RGB")
        buffer = io.BytesIO()
        rgb.save(buffer, format="png", optimize=True)
    write_atomic(path, buffer.getvalue())
    return path


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, then rename it over ``path``.

    Raises:
        OSError: the write or the rename failed; the error names ``path`` (not the
            temporary file), which is left as it was.
    """
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(path)) from None
    finally:
        if tmp is not None and Path(tmp).exists():
            Path(tmp).unlink()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def build_encoding(name: str, *, seed: int = 0, **shape: int | bool) -> PositionalEncoding:
    """``posenc.build(name)`` with ``DEFAULT_SHAPE`` filled in, in eval mode.

    Learned parameters are drawn under ``torch.manual_seed(seed)`` without touching the
    global random state, so figures and tours are reproducible.
    """
    kwargs = {**DEFAULT_SHAPE, **shape}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build(name, **kwargs).eval()


def line_positions(enc: PositionalEncoding, positions: Tensor) -> Tensor:
    """What ``enc`` rotates at for tokens on a line at ``positions [T]``: the positions
    themselves (M-RoPE reads them as text), or for patch coordinates (``position_shape``
    ``"[N, A]"``) the patches ``(0, ..., 0, p)`` along one row."""
    if enc.position_shape != "[N, A]":
        return positions
    return torch.nn.functional.pad(positions[..., None], (enc.axes - 1, 0))


def encodings_at(site: Site, names: list[str] | None = None) -> list[str]:
    """The registered names acting at ``site`` (all of them when ``names`` is None).

    Raises:
        ValueError: a name in ``names`` is unknown or does not act at ``site``.
    """
    from posenc.base import info

    if names is None:
        return [n for n in available() if info(n).sites & site]
    for name in names:
        if not info(name).sites & site:
            raise ValueError(
                f"encoding {name!r} does not act at the {site.name.lower()} site; "
                f"choose from: {', '.join(encodings_at(site))}"
            )
    return list(names)


def absolute_table(
    source: str | Path | Tensor | np.ndarray,
    *,
    d_model: int = 128,
    length: int = 100,
    key: str | None = None,
) -> tuple[np.ndarray, str]:
    """The table ``[L, C]`` (float64) of an absolute encoding, with a label for titles.

    Args:
        source: a registered encoding name acting at the input site (built with
            ``d_model`` and ``max_len=length``; learned tables are then at their
            initialisation), a path to a saved table or state dict (see ``load_table``),
            or a ``[L, C]`` tensor/array.
        d_model: width ``C`` of a built encoding.
        length: number of positions ``L`` of a built encoding.
        key: state-dict key of the table when ``source`` is a file.

    Raises:
        ValueError: unknown name, an encoding that adds nothing to the input, a table
            that is not 2-D.
        FileNotFoundError: a path that does not exist.
    """
    if isinstance(source, (Tensor, np.ndarray)):
        return _as_table(source, "table"), "table"
    if not (isinstance(source, str) and source in available()):
        bare = isinstance(source, str) and not Path(source).suffix and "/" not in source
        if bare and not Path(source).exists():  # an unknown name, not a file
            encodings_at(Site.INPUT, [source])
        table = load_table(source, key=key)
        return table, Path(source).name
    encodings_at(Site.INPUT, [source])
    length = check_int("length", length)
    enc = build_encoding(source, d_model=d_model, max_len=length)
    with torch.no_grad():
        table = enc.embed(torch.zeros(1, length, d_model, dtype=torch.float64))[0]  # [L, C]
    trained = any(True for _ in enc.parameters())
    return table.numpy(), f"{source} (at initialisation)" if trained else source


def load_table(path: str | Path, *, key: str | None = None) -> np.ndarray:
    """Load a position table ``[L, C]`` saved with ``torch.save``.

    The file may hold the tensor itself, a state dict, or a dict wrapping one under
    ``"model"`` or ``"state_dict"`` (a checkpoint). Without ``key``, the table is the one
    2-D floating tensor whose key names a position table (contains ``"pos"`` or ends
    with ``encoding.weight``, as in a ``posenc.lab.TinyLM`` state dict, where the shared
    encoding appears once per layer).
    Loaded with ``torch.load(weights_only=True)``: no code in the file is run.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: a file that ``torch.load(weights_only=True)`` cannot read (text, JSON,
            empty, a pickle of other objects); ``key`` missing, no or several candidate
            tables.
    """
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "is a directory", str(path))
    if not path.is_file():
        raise FileNotFoundError(f"no table file {str(path)!r}")
    obj = _load_weights(path)
    if isinstance(obj, Tensor):
        return _as_table(obj, str(path))
    if not isinstance(obj, dict):
        raise ValueError(f"{str(path)!r} holds a {type(obj).__name__}, not a tensor or dict")
    for wrapper in ("model", "state_dict"):
        if isinstance(obj.get(wrapper), dict):
            obj = obj[wrapper]
    if key is not None:
        if key not in obj:
            raise ValueError(f"key {key!r} is not in {str(path)!r}; keys: {', '.join(obj)}")
        return _as_table(obj[key], key)
    found: dict[str, Tensor] = {}
    for name, value in obj.items():
        usable = isinstance(value, Tensor) and value.dim() == 2 and value.is_floating_point()
        named = "pos" in name.lower() or name.endswith("encoding.weight")
        # one encoding shared by every layer appears under several keys: keep it once
        if usable and named and not any(torch.equal(value, v) for v in found.values()):
            found[name] = value
    if len(found) != 1:
        if not found:
            raise ValueError(
                f"{str(path)!r} holds no position table (a 2-D float tensor whose key contains "
                f"'pos' or ends with 'encoding.weight'); keys: {', '.join(obj) or 'none'}"
            )
        raise ValueError(f"{str(path)!r} holds several tables ({', '.join(found)}); pass key=")
    return _as_table(*found.values(), str(path))


def _load_weights(path: Path) -> object:
    """``torch.load(path, weights_only=True)``; unreadable files raise one ``ValueError``.

    torch's own messages advise retrying with ``weights_only=False``, which would run any
    code in the file: they are replaced, not passed on.
    """
    try:
        with warnings.catch_warnings():  # pickle-protocol notes of the weights-only loader
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", weights_only=True)
    except OSError as exc:  # name the file (torch's read errors do not)
        raise OSError(exc.errno, exc.strerror, str(path)) from None
    except Exception as exc:  # torch raises KeyError, EOFError, UnpicklingError, ...
        if isinstance(exc, pickle.UnpicklingError) and zipfile.is_zipfile(path):
            what = "holds objects other than tensors and plain containers"
        elif isinstance(exc, EOFError) and path.stat().st_size == 0:
            what = "is empty, not a table saved with torch.save"
        else:
            what = "is not a table saved with torch.save"
        raise ValueError(
            f"{str(path)!r} {what}; posenc loads tables with weights_only=True and runs no "
            "code from a file"
        ) from None


def _as_table(x: Tensor | np.ndarray, name: str) -> np.ndarray:
    table = x.detach().double().cpu().numpy() if isinstance(x, Tensor) else np.asarray(x, float)
    if table.ndim != 2 or min(table.shape) < 1:
        raise ValueError(f"{name} must be a non-empty [L, C] table, got shape {table.shape}")
    return table


def heatmap(
    ax: Axes,
    values: np.ndarray,
    *,
    cmap: str,
    label: str,
    symmetric: bool = False,
    limits: tuple[float, float] | None = None,
):
    """``imshow`` of ``values`` on ``ax`` with a labelled colorbar; returns the image.

    ``limits``: a fixed colour range (a bounded quantity, cosine in [-1, 1], gets one
    range in every panel); else symmetric about zero with ``symmetric``, else the data's.
    """
    finite = values[np.isfinite(values)]
    lim = float(np.abs(finite).max()) if symmetric and finite.size else None
    low, high = limits if limits is not None else (-lim, lim) if lim else (None, None)
    image = ax.imshow(
        values, aspect="auto", cmap=cmap, interpolation="nearest", vmin=low, vmax=high
    )
    ax.figure.colorbar(image, ax=ax, label=label, shrink=0.9)
    return image


def series_styles(count: int) -> list[dict[str, str]]:
    """``color`` and ``marker`` keywords for ``count`` curves of one panel, all distinct
    and dark enough on white (``posenc.palette``'s encoding colours, in a fixed order)."""
    order = ("rope", "sinusoidal", "alibi", "t5", "sandwich", "learned", "shaw", "xpos",
             "kerple", "fire", "cope", "nope")  # fmt: skip
    if count > len(order):
        raise ValueError(f"series_styles has {len(order)} distinct styles, asked for {count}")
    return [dict(zip(("color", "marker"), ENCODING_STYLES[name], strict=True)) for name in order][
        :count
    ]
