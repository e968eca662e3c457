#!/usr/bin/env bash
# Build the real Kubernetes control plane of one release (kube-apiserver, kube-controller-manager,
# kube-scheduler) and the etcd it is tested with, from their Go modules, and cache them by version.
#
#   tools/build-kube.sh v1.35.0        # prints the directory holding bin/{kube-apiserver,...,etcd}
#   KUBE_COMPONENTS="kube-apiserver etcd" tools/build-kube.sh v1.35.0    # only these
#
# Why this shape: `go install k8s.io/kubernetes/cmd/kube-apiserver@vX` is refused because k8s.io/kubernetes
# replaces its staging modules (k8s.io/api, k8s.io/apiserver, ...) with local paths. The published staging
# modules carry the same code at v0.<minor>.<patch>, so a throw-away module requires k8s.io/kubernetes and
# replaces every staging module by its published version, generated from kubernetes's own go.mod.
# etcd is the version kubernetes's go.mod requires (go.etcd.io/etcd/server/v3), started through its own
# etcdmain package, so the store is the one that kubernetes release was tested with.
# The version variables are stamped as kubernetes's hack/lib/version.sh does, so `kubectl version` and helm's
# kubeVersion checks see the real release, and the commit is the one the module proxy reports for the tag.
# Nothing of kubernetes or etcd is copied into this project: the modules come through the Go module proxy.
# The machine is shared: builds run under `nice` with one package at a time unless GOFLAGS says otherwise.
set -euo pipefail
version=${1:?usage: tools/build-kube.sh vX.Y.Z}
[[ $version =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] || { echo "not a Kubernetes release tag: $version (e.g. v1.35.0)" >&2; exit 2; }
minor=${BASH_REMATCH[1]}
patch=${BASH_REMATCH[2]}
components=${KUBE_COMPONENTS:-kube-apiserver kube-controller-manager kube-scheduler etcd}
for component in $components; do
  case $component in
    kube-apiserver | kube-controller-manager | kube-scheduler | etcd) ;;
    *) echo "KUBE_COMPONENTS: unknown component $component (valid: kube-apiserver kube-controller-manager kube-scheduler etcd)" >&2; exit 2 ;;
  esac
done
cache=${RUNBOOK_TOOLS_CACHE:-$HOME/.cache/talos-gpu-runbooks}/kube/$version
bin=$cache/bin
missing=()
for component in $components; do [[ -x $bin/$component ]] || missing+=("$component"); done
if ((${#missing[@]} == 0)); then echo "$cache"; exit 0; fi
command -v go >/dev/null || { echo "go is not installed (needed to build Kubernetes $version)" >&2; exit 2; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
export GOFLAGS="-mod=mod ${GOFLAGS:--p=1}" GOTOOLCHAIN=local
go mod init kube-build >/dev/null 2>&1
go mod download -json "k8s.io/kubernetes@$version" >download.json
python3 - "$version" "0.$minor.$patch" >go.mod <<'PY'
import json, re, sys
version, staging = sys.argv[1], sys.argv[2]
info = json.load(open("download.json"))
text = open(info["GoMod"]).read()
go = re.search(r"^go (\S+)", text, flags=re.M).group(1)
# Every `k8s.io/x => ./staging/src/k8s.io/x` becomes `k8s.io/x => k8s.io/x v0.<minor>.<patch>`.
local = re.findall(r"^\s*(k8s\.io/\S+) => \./staging/src/\S+", text, flags=re.M)
etcd = re.search(r"^\s*go\.etcd\.io/etcd/server/v3 (\S+)", text, flags=re.M).group(1)
print(f"module kube-build\n\ngo {go}\n")
print(f"require (\n\tk8s.io/kubernetes {version}\n\tgo.etcd.io/etcd/server/v3 {etcd}\n)\n")
print("replace (")
for module in local:
    print(f"\t{module} => {module} v{staging}")
print(")")
PY
mkdir -p etcd
printf 'package main\n\nimport (\n\t"os"\n\n\t"go.etcd.io/etcd/server/v3/etcdmain"\n)\n\nfunc main() { etcdmain.Main(os.Args) }\n' >etcd/main.go
printf '//go:build tools\n\npackage tools\n\nimport (\n\t_ "k8s.io/kubernetes/cmd/kube-apiserver"\n\t_ "k8s.io/kubernetes/cmd/kube-controller-manager"\n\t_ "k8s.io/kubernetes/cmd/kube-scheduler"\n)\n' >tools.go
go mod tidy >/dev/null
commit=$(python3 -c 'import json; print(json.load(open("download.json")).get("Origin", {}).get("Hash", ""))')
built=$(python3 -c 'import json; print(json.load(open(json.load(open("download.json"))["Info"]))["Time"])')
stamp=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  stamp+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
  stamp+=" -X $pkg.gitCommit=$commit -X $pkg.gitTreeState=clean -X $pkg.buildDate=$built"
done
mkdir -p "$bin"
for component in "${missing[@]}"; do
  if [[ $component == etcd ]]; then pkg=./etcd; else pkg=k8s.io/kubernetes/cmd/$component; fi
  nice -n 10 go build -trimpath -ldflags "-s -w$stamp" -o "$bin/$component.tmp" "$pkg"
  mv "$bin/$component.tmp" "$bin/$component"
done
echo "$cache"
