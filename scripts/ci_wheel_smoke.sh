#!/usr/bin/env bash
# CI: the installed package, as users get it. Builds posenc's wheel, installs it into a
# fresh virtual environment in a scratch folder outside the source tree (torch: the same
# build as .venv's, from POSENC_TORCH_INDEX when given; everything with the tested
# constraints), and runs scripts/smoke_installed.py from that folder twice: with a C++
# compiler (the kernel is compiled on first use into a fresh cache) and with none visible
# (CXX names a compiler that does not exist: the PyTorch path, named by posenc --version).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
. .venv/bin/activate
torch_version=$(python -c "import torch; print(torch.__version__)")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir "$work/dist" .
python -m venv "$work/venv"
deactivate
# --no-compile: byte-compiling torch's thousands of modules would double the install time
"$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-compile \
  -c "$repo/requirements/pinned.txt" ${POSENC_TORCH_INDEX:+--extra-index-url "$POSENC_TORCH_INDEX"} \
  "torch==$torch_version" "$work"/dist/posenc-*.whl
echo "ci_wheel_smoke: installed in ${SECONDS} s"
cd "$work"
for expect in kernel fallback; do
  mkdir -p "$work/$expect"
  export POSENC_CACHE_DIR="$work/$expect/cache"
  if [ "$expect" = fallback ]; then export CXX="$work/no-such-compiler"; fi
  version=$("$work/venv/bin/posenc" --version)
  echo "$version"
  case "$expect:$version" in
    "kernel:"*"(RoPE on CPU: compiled C++ kernel)" | "fallback:"*"(RoPE on CPU: PyTorch fallback (no C++ compiler"*) ;;
    *) echo "ci_wheel_smoke: posenc --version does not name the $expect path" >&2; exit 1 ;;
  esac
  "$work/venv/bin/python" "$repo/scripts/smoke_installed.py" "$expect" "$work/$expect"
done
echo "ci_wheel_smoke: passed in ${SECONDS} s"
