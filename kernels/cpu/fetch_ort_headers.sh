#!/usr/bin/env bash
# Fetch ONNX Runtime's C/C++ headers (not shipped in the onnxruntime pip wheel) from Debian's
# libonnxruntime-dev package, without touching the system's apt configuration, into
#   ${1:-${SSMCC_CACHE_DIR:-$HOME/.cache/ssmcc}/ort-headers}/onnxruntime/*.h
# (where ssmcc's kernel build looks: kernels/cpu/build.py, default_header_dir).
# A custom-op library built against these headers (ORT_API_VERSION 21) loads in newer runtimes.
set -euo pipefail
dest="${1:-${SSMCC_CACHE_DIR:-$HOME/.cache/ssmcc}/ort-headers}"
if [ -f "$dest/onnxruntime/onnxruntime_cxx_api.h" ]; then
  echo "ONNX Runtime headers already in $dest/onnxruntime"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial"
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" > "$work/trixie.list"
opts=(-o "Dir::Etc::SourceList=$work/trixie.list" -o Dir::Etc::SourceParts=/dev/null -o "Dir::State::Lists=$work/lists")
apt-get "${opts[@]}" -qq update
(cd "$work" && apt-get "${opts[@]}" -qq download libonnxruntime-dev)
dpkg -x "$work"/libonnxruntime-dev_*.deb "$work/x"
mkdir -p "$dest"
rm -rf "$dest/onnxruntime"
cp -r "$work/x/usr/include/onnxruntime" "$dest/onnxruntime"
echo "ONNX Runtime headers installed in $dest/onnxruntime"
