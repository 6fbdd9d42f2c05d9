"""What one runtime makes of a checkpoint's positions: ``LayerPositions`` and ``Reading``.

Shapes: ``P`` audited positions, ``R`` rotary_dim, ``L`` layers.

Every reader (transformers, posenc's plan, GGUF as llama.cpp interprets it, vLLM) returns
one ``Reading``; the comparer (``posenc.audit.compare``) takes several and never looks at a
runtime's own objects. For RoPE (Su et al., 2021, eq. 34) the score of a query at position
``m`` and a key at ``n`` rotates each frequency pair ``j`` by ``(m - n) * theta_j``, with the
runtime's cos/sin multiplied by a scale ``s`` (YaRN's ``mscale``, Peng et al., 2023, eq. 22;
LongRoPE's attention factor): the pair's score term is ``s^2 cos((m - n) theta_j)``. So a
layer is described by which pairs rotate and how (``pairs``), its angle table
``angles[p, j] = positions[p] * theta_j`` and ``scale[p]`` — what each runtime hands its
attention kernel, whatever its code path.

The comparer's input contract:

* every ``Reading`` has the same ``positions`` (the readers are called with the same ones);
* ``layers[i]`` is layer ``i`` of the checkpoint in every reading (same ``L``);
* a reading whose runtime could not run has ``note`` set and no layers; it is shown as not
  run and counts neither as agreeing nor as differing;
* ``fields`` holds the raw values the runtime read (``"llama.rope.freq_base"``,
  ``"rope_parameters.factor"``, ...), shown beside the table; they are not compared;
* length-dependent scalings (dynamic NTK, LongRoPE's short/long factors) are evaluated for a
  sequence of ``context`` tokens (``Reading.context``), the same in every reading.

A reading crosses a process boundary (vLLM runs in its own environment) as JSON:
``Reading.to_dict`` / ``Reading.from_dict``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["PAIRS", "LayerPositions", "Reading", "no_rotation"]

#: Pair layouts: ``"half"`` rotates dims ``(j, j + R/2)`` (GPT-NeoX, transformers' default,
#: llama.cpp's ``LLAMA_ROPE_TYPE_NEOX``), ``"adjacent"`` rotates ``(2j, 2j + 1)`` (the paper,
#: GPT-J, llama.cpp's ``LLAMA_ROPE_TYPE_NORM``), ``"none"`` for a layer that does not rotate.
PAIRS = ("half", "adjacent", "none")


@dataclass(frozen=True, eq=False)
class LayerPositions:
    """One attention layer's positions as a runtime computes them.

    Args:
        rotates: whether the layer rotates queries and keys at all (False: NoPE / ALiBi).
        head_dim: ``D``, the query/key head width.
        rotary_dim: ``R``, the rotated leading dims (``R <= D``, even; 0 when not rotating).
        pairs: one of ``PAIRS``.
        angles: ``[P, R/2]`` float64, ``positions[p] * theta_j`` (``[P, 0]`` when not rotating).
        scale: ``[P]`` float64, the factor on cos and sin at each position (1 for plain RoPE).
        softmax_scale: the factor on ``q . k`` when the runtime changes it from
            ``1 / sqrt(head_dim)`` (None: that default).
        sliding_window: the layer's attention window in tokens (None: full attention).
        alibi_max_bias: ALiBi's maximum bias when the layer adds one (None: no ALiBi).
        extra: further per-layer facts a runtime states (M-RoPE ``sections``, ...),
            compared as values.
    """

    rotates: bool
    head_dim: int
    rotary_dim: int
    pairs: str
    angles: np.ndarray
    scale: np.ndarray
    softmax_scale: float | None = None
    sliding_window: int | None = None
    alibi_max_bias: float | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.pairs not in PAIRS:
            raise ValueError(f"pairs must be one of {PAIRS}, got {self.pairs!r}")
        if self.rotary_dim < 0 or self.rotary_dim % 2 or self.rotary_dim > self.head_dim:
            raise ValueError(
                f"rotary_dim must be even and in [0, head_dim={self.head_dim}], "
                f"got {self.rotary_dim}"
            )
        if self.rotates != (self.pairs != "none") or (not self.rotates and self.rotary_dim):
            raise ValueError(
                f"rotates={self.rotates} disagrees with pairs={self.pairs!r}, "
                f"rotary_dim={self.rotary_dim}"
            )
        angles = np.asarray(self.angles, dtype=np.float64)
        scale = np.asarray(self.scale, dtype=np.float64)
        if angles.ndim != 2 or angles.shape[1] != self.rotary_dim // 2:
            raise ValueError(
                f"angles must be [P, rotary_dim/2={self.rotary_dim // 2}], got {angles.shape}"
            )
        if scale.shape != (angles.shape[0],):
            raise ValueError(f"scale must be [P={angles.shape[0]}], got {scale.shape}")
        object.__setattr__(self, "angles", angles)
        object.__setattr__(self, "scale", scale)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (lists for the arrays)."""
        return {
            "rotates": self.rotates,
            "head_dim": self.head_dim,
            "rotary_dim": self.rotary_dim,
            "pairs": self.pairs,
            "angles": self.angles.tolist(),
            "scale": self.scale.tolist(),
            "softmax_scale": self.softmax_scale,
            "sliding_window": self.sliding_window,
            "alibi_max_bias": self.alibi_max_bias,
            "extra": dict(self.extra),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LayerPositions:
        """Inverse of ``to_dict``."""
        fields = dict(data)
        angles = np.asarray(fields.pop("angles"), dtype=np.float64)
        if angles.ndim == 1:  # json of an empty [P, 0] comes back as P empty lists: [P, 0]
            angles = angles.reshape(len(angles), 0)
        return cls(angles=angles, **fields)


def no_rotation(head_dim: int, num_positions: int, **kwargs: Any) -> LayerPositions:
    """A layer that does not rotate (NoPE, ALiBi): ``[P, 0]`` angles, unit scale."""
    return LayerPositions(
        rotates=False,
        head_dim=head_dim,
        rotary_dim=0,
        pairs="none",
        angles=np.zeros((num_positions, 0)),
        scale=np.ones(num_positions),
        **kwargs,
    )


@dataclass(frozen=True, eq=False)
class Reading:
    """One runtime's reading of a checkpoint's positions.

    Args:
        runtime: who read it (``"transformers"``, ``"posenc"``, ``"llama.cpp (GGUF)"``,
            ``"vllm"``, ...).
        positions: ``[P]`` int64, the audited positions (same in every reading compared).
        context: the sequence length length-dependent scalings are evaluated for.
        layers: ``L`` layer descriptions (empty when ``note`` says the runtime did not run).
        fields: the raw fields the runtime read, name to value (JSON-able values).
        note: why the runtime could not run, or a caveat of its reading (None: none).
    """

    runtime: str
    positions: np.ndarray
    context: int
    layers: tuple[LayerPositions, ...] = ()
    fields: Mapping[str, Any] = field(default_factory=dict)
    note: str | None = None

    def __post_init__(self) -> None:
        positions = np.asarray(self.positions)
        if positions.ndim != 1 or not np.issubdtype(positions.dtype, np.integer):
            raise ValueError(f"positions must be a 1-D integer array, got {positions!r}")
        object.__setattr__(self, "positions", positions.astype(np.int64))
        object.__setattr__(self, "layers", tuple(self.layers))
        for i, layer in enumerate(self.layers):
            if layer.angles.shape[0] != len(positions):
                raise ValueError(
                    f"layer {i}: angles has {layer.angles.shape[0]} rows for "
                    f"{len(positions)} positions"
                )
        if not self.layers and self.note is None:
            raise ValueError(f"{self.runtime}: a reading without layers must say why (note)")

    @property
    def ran(self) -> bool:
        """Whether the runtime produced layers (False: see ``note``)."""
        return bool(self.layers)

    def thetas(self, index: int) -> np.ndarray:
        """``[R/2]`` layer ``index``'s frequencies, from the angle table at the last position."""
        last = int(self.positions[-1])
        if last == 0:
            raise ValueError("thetas needs a nonzero last position")
        return self.layers[index].angles[-1] / last

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready; ``from_dict`` reads it back."""
        return {
            "runtime": self.runtime,
            "positions": self.positions.tolist(),
            "context": self.context,
            "layers": [layer.to_dict() for layer in self.layers],
            "fields": {k: _jsonable(v) for k, v in self.fields.items()},
            "note": self.note,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Reading:
        """Inverse of ``to_dict``."""
        return cls(
            runtime=data["runtime"],
            positions=np.asarray(data["positions"], dtype=np.int64),
            context=int(data["context"]),
            layers=tuple(LayerPositions.from_dict(x) for x in data["layers"]),
            fields=dict(data.get("fields") or {}),
            note=data.get("note"),
        )


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value
