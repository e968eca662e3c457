#!/usr/bin/env bash
# Build simnode (the simulated Talos node API, simnode/) and cache it by a hash of its sources.
#
#   tools/build-simnode.sh        # prints the binary's path
#
# The cache key is the SHA-256 of simnode's go.mod, go.sum and *.go files, so an edit rebuilds and an
# unchanged tree reuses ~/.cache/talos-gpu-runbooks/simnode/<hash>/simnode. Dependencies come through the Go
# module proxy and are verified against simnode/go.sum only (-mod=readonly: the build never rewrites it).
# A caller's GOFLAGS are kept (e.g. GOFLAGS=-p=1 on a shared machine).
set -euo pipefail
src=$(cd "$(dirname "$0")/../simnode" && pwd)
hash=$(cd "$src" && find . -maxdepth 1 \( -name '*.go' -o -name go.mod -o -name go.sum \) -print | LC_ALL=C sort |
	xargs sha256sum | sha256sum | cut -c1-16)
cache=${RUNBOOK_TOOLS_CACHE:-$HOME/.cache/talos-gpu-runbooks}/simnode/$hash
out=$cache/simnode
if [[ -x $out ]]; then echo "$out"; exit 0; fi
command -v go >/dev/null || { echo "go is not installed (needed to build simnode)" >&2; exit 2; }

export GOFLAGS="-mod=readonly${GOFLAGS:+ $GOFLAGS}" GONOSUMDB='github.com/siderolabs/*,github.com/smira/*' GOTOOLCHAIN=local
mkdir -p "$cache"
(cd "$src" && go build -trimpath -o "$out.tmp.$$" .)
mv "$out.tmp.$$" "$out"  # per-process temp name: concurrent builds never share a file
echo "$out"
