#!/usr/bin/env bash
# Build simkube (the control-plane launcher in simkube/: certificates, tokens, Talos's admission settings,
# etcd + kube-apiserver + controller-manager + scheduler under one supervisor) and cache it per source hash.
#
#   tools/build-simkube.sh        # prints the binary's path
#
# simkube uses the Go standard library only, so the build downloads nothing. The cache key is the SHA-256 of
# its go.mod and *.go files: an edit rebuilds, an unchanged tree reuses the cached binary.
set -euo pipefail
src=$(cd "$(dirname "$0")/../simkube" && pwd)
key=$(cd "$src" && sha256sum go.mod ./*.go | sha256sum | cut -c1-16)
out=${RUNBOOK_TOOLS_CACHE:-$HOME/.cache/talos-gpu-runbooks}/simkube/$key/simkube
[[ -x $out ]] && { echo "$out"; exit 0; }
command -v go >/dev/null || { echo "go is not installed (needed to build simkube)" >&2; exit 2; }
mkdir -p "$(dirname "$out")"
(cd "$src" && GOTOOLCHAIN=local go build -trimpath -o "$out.$$" .)
mv "$out.$$" "$out"
echo "$out"
