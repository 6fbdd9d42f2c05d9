#!/usr/bin/env bash
# CI: the CPU RoPE kernel built with AddressSanitizer and UndefinedBehaviorSanitizer into a
# scratch cache, then the kernel fuzz test (many more examples than the suite's) and the
# hardening tests against it. Any out-of-bounds access or undefined behaviour stops the run
# with the sanitizer's report (exit status non-zero). A few minutes on two cores.
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
compiler=${CXX:-c++}
export POSENC_CACHE_DIR="$work/cache"
export POSENC_KERNEL_CFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g"
export POSENC_FUZZ_EXAMPLES=${POSENC_FUZZ_EXAMPLES:-1500}
export ASAN_OPTIONS=detect_leaks=0:halt_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# Python is not instrumented: the sanitizer runtimes must be loaded before anything else.
export LD_PRELOAD="$($compiler -print-file-name=libasan.so) $($compiler -print-file-name=libubsan.so)"
python -m posenc.encodings.rotary.build_kernel
version=$(python -m posenc --version)
echo "$version"
case "$version" in
  *"compiled C++ kernel"*) ;;
  *) echo "ci_asan_fuzz: the sanitized kernel is not the active path" >&2; exit 1 ;;
esac
# -s: a sanitizer report is written to stderr as the process dies, past pytest's capture
python -m pytest -q -s -p no:cacheprovider tests/test_rope_kernel_fuzz.py tests/test_rope_hardening.py
