#!/usr/bin/env bash
# The transformers-facing tests (interop walks, patch, extend) against other transformers
# releases than the pinned one: the oldest supported (pyproject's lower bound) and the newest
# the package index serves today. Each runs in a fresh virtual environment beside the
# pinned set of everything else; a newest release equal to the pinned one is not run twice.
# Usage: bash scripts/test_transformers_versions.sh [oldest|newest ...]   (default: both)
set -euo pipefail
cd "$(dirname "$0")/.."
OLDEST=5.23.0
PINNED=$(sed -n 's/^transformers==//p' requirements/pinned.txt)
TESTS=(tests/test_patch.py tests/test_extend.py tests/test_hf_config.py tests/test_hf_families.py
       tests/test_hf_coverage.py tests/test_hf_layers.py tests/test_hf_logits.py
       tests/test_interop_positions.py tests/test_interop_text_families.py
       tests/test_interop_multimodal.py tests/test_interop_position_modules.py
       tests/test_schemes_transformers.py)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
grep -v '^transformers==' requirements/pinned.txt > "$work/constraints.txt"
newest() {
  python3 -m pip index versions transformers 2>/dev/null | sed -n 's/^transformers (\(.*\))$/\1/p'
}
for which in "${@:-oldest newest}"; do
  for label in $which; do
    case "$label" in
      oldest) version=$OLDEST ;;
      newest) version=$(newest) ;;
      *) echo "usage: $0 [oldest|newest ...]" >&2; exit 2 ;;
    esac
    if [ -z "$version" ]; then
      echo "transformers $label: the package index gave no version; not tested"
      continue
    fi
    if [ "$version" = "$PINNED" ]; then
      echo "transformers $label is $version, the pinned version: tested by the main suite"
      continue
    fi
    echo "== transformers $version ($label)"
    python3 -m venv "$work/$label"
    "$work/$label/bin/python" -m pip install --quiet -c "$work/constraints.txt" "torch==2.13.0" \
      ${POSENC_TORCH_INDEX:+--index-url "$POSENC_TORCH_INDEX"}
    "$work/$label/bin/python" -m pip install --quiet -c "$work/constraints.txt" \
      "transformers==$version" -e ".[test]"
    "$work/$label/bin/python" -m pytest -q -p no:cacheprovider "${TESTS[@]}"
  done
done
