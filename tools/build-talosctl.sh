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
# The module proxy serves some releases' zip but refuses their go.mod ("403 This module version is not available"
# for talos v1.5.5's .mod, asked 2026-12-02, while its .info and .zip answer 200). A module's .mod is the go.mod
# file inside its zip, so a file proxy in front of the others serves that one file; every other lookup falls
# through it to the module proxy. The proxy itself is asked (a module cache may hold the .mod already), and the
# substitution is recorded in substitutions.txt beside the binary.
mod_refused() {
    local proxy
    proxy=$(go env GOPROXY | tr ',|' '\n\n' | grep -m1 '^https\?://') || return 1
    python3 - "$proxy" "$version" "$work/modproxy" <<'ZIP'
import io, os, sys, urllib.error, urllib.request, zipfile
proxy, version, root = sys.argv[1].rstrip("/"), sys.argv[2], sys.argv[3]
base = f"{proxy}/github.com/siderolabs/talos/@v/{version}"
try:
    urllib.request.urlopen(f"{base}.mod", timeout=60).close()
    sys.exit(1)  # served: nothing to do
except urllib.error.HTTPError as err:
    if err.code != 403:
        sys.exit(1)  # go mod download reports it
except OSError:
    sys.exit(1)  # offline: a warm module cache may still build
try:
    with urllib.request.urlopen(f"{base}.zip", timeout=600) as reply:
        mod = zipfile.ZipFile(io.BytesIO(reply.read())).read(f"github.com/siderolabs/talos@{version}/go.mod")
except (OSError, KeyError, zipfile.BadZipFile):
    sys.exit(1)  # no zip either: go mod download reports the refused .mod
os.makedirs(f"{root}/github.com/siderolabs/talos/@v", exist_ok=True)
open(f"{root}/github.com/siderolabs/talos/@v/{version}.mod", "wb").write(mod)
ZIP
}
mod_note=
if mod_refused; then
    export GOPROXY="file://$work/modproxy,$(go env GOPROXY)"
    mod_note="github.com/siderolabs/talos $version/go.mod => the go.mod file of its module zip (the proxy refuses the .mod)"
    echo "build-talosctl.sh: $mod_note" >&2
fi
if ! go mod download -json "github.com/siderolabs/talos@$version" >download.json; then
    python3 -c 'import json; print(json.load(open("download.json")).get("Error", "download failed"))' >&2
    exit 1
fi
python3 - "$version" >go.mod.new <<'PY'
import json, re, subprocess, sys
version = sys.argv[1]
#: Dependencies of a release that the module proxy refuses ("403 This module version is not available", asked
#: 2026-12-02 for talos v1.14.1's go.mod), and the nearest version it serves. Each is printed when used and
#: recorded in substitutions.txt beside the binary: that talosctl is the release's own source built on these.
SUBSTITUTES = {
    "github.com/cosi-project/runtime v1.16.3": "v1.16.2",
    "github.com/jsimonetti/rtnetlink/v2 v2.2.1-0.20260802200809-43bafec815b3": "v2.3.0",
}


def served(line):
    """Whether the module proxy serves the fork a replace line points at. Talos 1.14.1's forks of ethtool
    (v0.6.0-sidero) and siv-go (a pseudo-version) are answered "403 This module version is not available", which
    stops go mod tidy although talosctl may import neither: such a line is dropped, saying so, and the build
    below either succeeds on the upstream module or fails naming the package that needs the fork."""
    target = line.split("=>")[1].split()
    if len(target) != 2:
        return True
    proc = subprocess.run(["go", "mod", "download", "-json", "@".join(target)], capture_output=True, text=True)
    if proc.returncode == 0:
        return True
    print(f"build-talosctl.sh: dropped replace {line}: the module proxy does not serve the fork", file=sys.stderr)
    return False


def substitutes(text):
    """Replace lines for the refused versions this go.mod requires (SUBSTITUTES)."""
    lines = []
    for wanted, served_version in SUBSTITUTES.items():
        if re.search(rf"^\s*{re.escape(wanted)}(\s|$)", text, flags=re.M):
            lines.append(f"{wanted} => {wanted.split()[0]} {served_version}")
            print(f"build-talosctl.sh: substituted {wanted} => {served_version} (not served)", file=sys.stderr)
    with open("substitutions.txt", "w") as out:
        out.writelines(line + "\n" for line in lines)
    return lines


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
for line in substitutes(text):
    print("\t" + line)
for line in replaces:
    line = line.split("//")[0].strip()
    # Local paths are talos's own tree; the containerd fork only trims dead code from machined (talos
    # issue 11296) and some of its pseudo-versions are not served by the module proxy ("403 This module
    # version is not available" for v1.13.0's): upstream containerd builds the same talosctl.
    if "=> ./" in line or "=> ../" in line or line.startswith("github.com/containerd/containerd/v2 "):
        continue
    if not served(line):
        continue
    print("\t" + line)
print(")")
PY
mv go.mod.new go.mod
if [[ -n $mod_note ]]; then echo "$mod_note" >>substitutions.txt; fi
cp "$(python3 -c 'import json; print(json.load(open("download.json"))["Dir"])')/go.sum" go.sum
chmod u+w go.sum
printf '//go:build tools\n\npackage tools\n\nimport _ "github.com/siderolabs/talos/cmd/talosctl"\n' >tools.go
go mod tidy >/dev/null
mkdir -p "$cache"
if [[ -s substitutions.txt ]]; then cp substitutions.txt "$cache/substitutions.txt"; fi
go build -trimpath -o "$out.tmp.$$" github.com/siderolabs/talos/cmd/talosctl
mv "$out.tmp.$$" "$out"
echo "$out"
