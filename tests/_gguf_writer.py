"""GGUF files written with ``gguf``'s writer from a config.json, as llama.cpp's converter
writes them (``posenc.audit.convert.converter_fields``), with a hook to reproduce a defect."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from posenc.audit.convert import INT_KEYS, converter_fields

Edit = Callable[[str, dict[str, Any], dict[str, np.ndarray]], None]


def write_gguf(
    path: Path,
    config: Mapping[str, Any],
    *,
    edit: Edit | None = None,
    tensors: Mapping[str, np.ndarray] | None = None,
    architecture: str | None = None,
) -> Path:
    """Write ``config``'s GGUF at ``path``; ``edit(arch, kv, tensors)`` may change the
    fields first and ``architecture`` replace the converter's (a converter bug). Returns
    ``path``."""
    import gguf

    arch, kv, rope_tensors = converter_fields(config)
    arch = architecture or arch
    rope_tensors = {**rope_tensors, **(tensors or {})}
    if edit is not None:
        edit(arch, kv, rope_tensors)
    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in kv.items():
        full = f"{arch}.{key}"
        if key in INT_KEYS:
            writer.add_uint32(full, int(value))
        elif isinstance(value, str):
            writer.add_string(full, value)
        elif isinstance(value, list):
            writer.add_array(full, [int(v) for v in value])
        else:
            writer.add_float32(full, float(value))
    for name, values in rope_tensors.items():
        writer.add_tensor(name, np.ascontiguousarray(values))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
