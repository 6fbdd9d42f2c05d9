#!/usr/bin/env bash
# Set-up: a virtual environment in .venv with the CPU build of PyTorch installed first
# (a bare `torch` requirement would pull several GB of CUDA packages), then posenc with
# its test dependencies at the tested versions. Reuses an existing .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
if ! python -c "import torch" 2>/dev/null; then
  # From the index the user names (POSENC_TORCH_INDEX, e.g. https://download.pytorch.org/whl/cpu),
  # else the registry's own wheel, which is the CPU build on macOS and Windows but a CUDA build
  # on Linux x86-64 (the check below then stops and says what to set).
  python -m pip install --quiet -c requirements/pinned.txt "torch==2.13.0" \
    ${POSENC_TORCH_INDEX:+--index-url "$POSENC_TORCH_INDEX"}
fi
# Without a GPU the set-up wants a CPU build of torch: check what is installed.
if ! command -v nvidia-smi >/dev/null && [ ! -e /dev/kfd ]; then
  python -c "
import sys, torch
if torch.version.cuda or torch.version.hip:
    sys.exit(f'setup: no GPU here, but torch {torch.__version__} is a GPU build; remove .venv and '
             'rerun with POSENC_TORCH_INDEX=https://download.pytorch.org/whl/cpu')
print(f'setup: torch {torch.__version__} is a CPU build')
"
fi
# The tested set (requirements/pinned.txt): the same versions on every machine, whatever is
# released tomorrow; .ci/run also tests the newest and the oldest supported transformers.
python -m pip install --quiet -c requirements/pinned.txt -e ".[test]"
# torchtitan, for tests/test_parallel_torchtitan.py (its cp_shard and RoPE caches): without its
# declared dependencies (datasets, wandb, tensorboard); the modules tested need only these.
if python -c "import sys; sys.exit(sys.version_info < (3, 11))"; then
  python -m pip install --quiet --no-deps -c requirements/pinned.txt \
    torchtitan spmd_types tyro docstring_parser typeguard
fi
# The lab's English-prose corpus (`posenc lab --corpus fortunes`): Debian's fortunes
# package, plain text in /usr/share/games/fortunes; skipped where apt-get or root is not there.
if [ ! -d /usr/share/games/fortunes ] && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  (apt-get install -y -qq fortunes >/dev/null 2>&1 \
    || (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq fortunes >/dev/null 2>&1)) \
    || echo "setup: could not install Debian's fortunes package (posenc lab --corpus fortunes needs it)"
fi
# The compiled CPU RoPE kernel, built now rather than on first use (about 10 s with a C++
# compiler and ninja, into ~/.cache/posenc); without one apply_rope runs its PyTorch path,
# and `posenc --version` says so.
python -m posenc.encodings.rotary.build_kernel || true
python -c "import torch, posenc; print('posenc', posenc.__version__, 'torch', torch.__version__)"
