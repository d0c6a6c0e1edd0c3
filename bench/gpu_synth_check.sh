#!/usr/bin/env bash
# Generates the synthetic benchmark models on the device machine (models do
# not travel) and lets synth verify each file through the GGUF reader.
set -eu
export TDM_ROOT=${TDM_ROOT:-$PWD}
BUILD=${BUILD:-build/dev}
DIR=${SYNTH_DIR:-/tmp/synth}
mkdir -p "$DIR"
"$BUILD"/tools/synth --preset qwen35-35b-a3b -o "$DIR/qwen35-35b-a3b-synth-Q4_K_M.gguf"
"$BUILD"/tools/synth --preset qwen3-30b-a3b --layers 4 -o "$DIR/qwen3-30b-a3b-4L.gguf"
"$BUILD"/tools/synth --preset qwen3next-80b-a3b --layers 4 -o "$DIR/qwen3next-80b-a3b-4L.gguf"
ls -la "$DIR"
