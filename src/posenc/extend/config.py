"""What ``posenc extend`` measures: the checkpoint, the settings (original positions and
each scaling at each factor), the evaluation lengths, the text and the passkey trials.

Shapes: ``L0`` the checkpoint's trained length (its rope parameters'
``original_max_position_embeddings``, else ``max_position_embeddings``). A setting is
``"original"`` or ``"<scaling> x<factor>"``: the HF-style dict of
``posenc.lab.variants.scaling_spec`` (``original_max_position_embeddings = L0`` for YaRN
and dynamic NTK; dynamic NTK takes the factor as its own hyperparameter) applied with
``posenc.hf.patch`` (Chen et al. 2023; bloc97 2023; emozilla 2023; Peng et al. 2023).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from posenc._checks import check_float, check_int
from posenc.lab.variants import scaling_spec

__all__ = ["SCALINGS", "ExtendConfig", "Setting", "config_hash", "read_config", "trained_length"]

#: The scalings ``posenc extend`` applies from a factor alone.
SCALINGS = ("linear", "ntk", "dynamic", "yarn")
#: The precisions a checkpoint can be evaluated in.
DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class Setting:
    """One row of the report: a label and the scaling (None: the original positions)."""

    label: str
    scaling: dict[str, Any] | None


@dataclass(frozen=True)
class ExtendConfig:
    """The options of one ``posenc extend`` run (validated on construction).

    Raises:
        ValueError: an unknown scaling or dtype, a factor below 1, a length below 2, no
            length, a chunk or count below 1.
    """

    model_dir: str
    scalings: tuple[str, ...] = SCALINGS
    factors: tuple[float, ...] = (2.0, 4.0)
    eval_lens: tuple[int, ...] = ()
    corpus: str | None = None
    windows: int = 2
    passkey_depths: tuple[float, ...] = (0.1, 0.5, 0.9)
    chunk: int = 512
    device: str = "cpu"
    dtype: str = "float32"
    seed: int = 0

    def __post_init__(self) -> None:
        for name in self.scalings:
            if name not in SCALINGS:
                raise ValueError(
                    f"posenc extend applies the scalings {', '.join(SCALINGS)} from a factor; "
                    f"got {name!r}"
                )
        for factor in self.factors:
            check_float("factor", factor, minimum=1.0)
        if not self.eval_lens:
            raise ValueError("no evaluation length given (--eval-lens)")
        for n in self.eval_lens:
            check_int("evaluation length", n, minimum=2)
        for depth in self.passkey_depths:
            if not 0.0 <= check_float("passkey depth", depth) <= 1.0:
                raise ValueError(f"passkey depth must be in [0, 1], got {depth}")
        check_int("windows", self.windows)
        check_int("chunk", self.chunk)
        check_int("seed", self.seed, minimum=0)
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")

    def settings(self, trained: int) -> list[Setting]:
        """``original`` then every scaling at every factor, for a checkpoint trained at
        ``trained`` tokens."""
        out = [Setting("original", None)]
        for kind in self.scalings:
            for factor in self.factors:
                spec = scaling_spec(kind, factor, trained, dynamic_factor=factor)
                out.append(Setting(f"{kind} x{factor:g}", spec))
        return out

    def to_dict(self) -> dict[str, Any]:
        """The options as a JSON-ready dict."""
        return asdict(self)


def read_config(model_dir: str | Path) -> dict[str, Any]:
    """The checkpoint's ``config.json`` as a dict.

    Raises:
        ValueError: the folder or its ``config.json`` is missing (or not a regular file:
            a FIFO is never opened), not a JSON object, or nested too deeply.
    """
    folder = Path(model_dir)
    if not folder.is_dir():
        raise ValueError(f"model folder {str(folder)!r} does not exist or is not a folder")
    path = folder / "config.json"
    if not path.is_file():
        raise ValueError(
            f"{str(folder)!r} has no config.json: pass a folder written by save_pretrained"
        )
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{str(path)!r} is not valid JSON ({exc})") from None
    except RecursionError:
        raise ValueError(f"{str(path)!r} nests too deeply to be a model configuration") from None
    if not isinstance(config, dict):
        raise ValueError(f"{str(path)!r} is not a JSON object")
    return config


def config_hash(config: Mapping[str, Any]) -> str:
    """sha256 of the config's canonical JSON (sorted keys), naming the checkpoint."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def trained_length(config: Mapping[str, Any]) -> int:
    """``L0``: the length the checkpoint's positions were trained for.

    Raises:
        ValueError: the config has no ``max_position_embeddings``.
    """
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    original = config.get("original_max_position_embeddings")
    if original is None and isinstance(params, Mapping):
        original = params.get("original_max_position_embeddings")
    if original is None:
        original = config.get("max_position_embeddings")
    if original is None:
        raise ValueError("config.json has no max_position_embeddings (the trained length)")
    return check_int("max_position_embeddings", original)
