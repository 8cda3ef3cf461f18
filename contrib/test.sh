#!/usr/bin/env bash
# Builds llmq with warnings as errors and runs the whole test suite (ctest).
#   contrib/test.sh [extra cmake args...]     e.g. -DLLMQ_SANITIZE=address,undefined
# BUILD_DIR (default build/) and CTEST_ARGS (e.g. "-L unit") are read from the environment. The speed
# checks of tests/bench/ are not part of the suite: CTEST_ARGS="-C bench -L bench" runs them alone.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
[ -f "$build/CMakeCache.txt" ] && gen=()  # keep the generator an existing build was made with
cmake -S . -B "$build" "${gen[@]}" -DLLMQ_WERROR=ON "$@"
cmake --build "$build" -j "$(nproc)"
cd "$build"
ctest --output-on-failure -j "$(nproc)" ${CTEST_ARGS:-}
