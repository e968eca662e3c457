#!/usr/bin/env bash
# Build the real talosctl of one Talos release from its Go module and cache it by version.
#
#   tools/build-talosctl.sh v1.12.0        # prints the binary's path
#
# Why this shape: `go install github.com/siderolabs/talos/cmd/talosctl@vX` refuses a module whose go.mod has
# replace directives, and talos has several (forks of containerd, wgctrl, ethtool, coredns; pkg/machinery as
# a local path). So a throw-away module requires talos and its published pkg/machinery at the same tag and
# repeats talos's replace lines (minus the local path). The release's own go.sum verifies every dependency:
# the forks are not in the public checksum database, so they are checked against that file only.
# Nothing of talos is copied into this project: the module is downloaded through the Go module proxy.
set -euo pipefail
version=${1:?usage: tools/build-talosctl.sh vX.Y.Z}
[[ $version =~ ^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.]+)?$ ]] || { echo "not a Talos tag: $version" >&2; exit 2; }
cache=${RUNBOOK_TOOLS_CACHE:-$HOME/.cache/talos-gpu-runbooks}/talosctl/$version
out=$cache/talosctl
if [[ -x $out ]]; then echo "$out"; exit 0; fi
command -v go >/dev/null || { echo "go is not installed (needed to build talosctl $version)" >&2; exit 2; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
# Caller's GOFLAGS (e.g. -p=1 on a shared machine) are kept.
export GOFLAGS="-mod=mod${GOFLAGS:+ $GOFLAGS}" GONOSUMDB='github.com/siderolabs/*,github.com/smira/*' GOTOOLCHAIN=local
go mod init talosctl-build >/dev/null 2>&1
if ! go mod download -json "github.com/siderolabs/talos@$version" >download.json; then
    python3 -c 'import json; print(json.load(open("download.json")).get("Error", "download failed"))' >&2
    exit 1
fi
python3 - "$version" >go.mod <<'PY'
import json, re, sys
version = sys.argv[1]
info = json.load(open("download.json"))
text = open(info["GoMod"]).read()
replaces = []
for block in re.findall(r"^replace \((.*?)^\)", text, flags=re.S | re.M):
    replaces += [line.strip() for line in block.splitlines() if "=>" in line]
replaces += [line[len("replace "):].strip() for line in text.splitlines() if line.startswith("replace ") and "=>" in line]
go = re.search(r"^go (\S+)", text, flags=re.M).group(1)
print("module talosctl-build\n")
print(f"go {go}\n")
print(f"require (\n\tgithub.com/siderolabs/talos {version}\n\tgithub.com/siderolabs/talos/pkg/machinery {version}\n)\n")
print("replace (")
for line in replaces:
    line = line.split("//")[0].strip()
    # Local paths are talos's own tree; the containerd fork only trims dead code from machined (talos
    # issue 11296) and some of its pseudo-versions are not served by the module proxy ("403 This module
    # version is not available" for v1.13.0's): upstream containerd builds the same talosctl.
    if "=> ./" in line or "=> ../" in line or line.startswith("github.com/containerd/containerd/v2 "):
        continue
    print("\t" + line)
print(")")
PY
cp "$(python3 -c 'import json; print(json.load(open("download.json"))["Dir"])')/go.sum" go.sum
chmod u+w go.sum
printf '//go:build tools\n\npackage tools\n\nimport _ "github.com/siderolabs/talos/cmd/talosctl"\n' >tools.go
go mod tidy >/dev/null
mkdir -p "$cache"
go build -trimpath -o "$out.tmp.$$" github.com/siderolabs/talos/cmd/talosctl
mv "$out.tmp.$$" "$out"
echo "$out"
