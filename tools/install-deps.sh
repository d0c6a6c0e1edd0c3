#!/usr/bin/env bash
# Installs what tandem needs to build and test on Debian 12 / Ubuntu 22.04+.
# Build: gcc, make, OpenMP (libgomp, part of gcc), hwloc, libnuma, cJSON,
# libmicrohttpd; tests: cmocka, clang + libFuzzer runtime, node + npm,
# chromium (web UI test); plots: gnuplot. CUDA is used when nvcc is present
# (/usr/local/cuda or PATH); it is not installed here.
set -euo pipefail
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
pkgs=(build-essential make pkg-config
      libhwloc-dev libnuma-dev libcjson-dev libmicrohttpd-dev
      libcmocka-dev clang libclang-rt-dev gnuplot-nox chromium)
# libclang-rt-dev is the unversioned name on newer releases; Debian 12 has -14.
if ! apt-cache show libclang-rt-dev >/dev/null 2>&1; then
    pkgs=("${pkgs[@]/libclang-rt-dev/libclang-rt-14-dev}")
fi
command -v node >/dev/null 2>&1 || pkgs+=(nodejs npm)
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
# npm packages of the API and UI tests (pinned by their package-lock.json files).
if [ -x tests/setup_node.sh ]; then
    tests/setup_node.sh
fi
echo "tandem dependencies installed"
