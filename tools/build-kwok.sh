#!/usr/bin/env bash
# Build kwok (Kubernetes WithOut Kubelet, sigs.k8s.io/kwok) from its Go module and write the stages it plays,
# cached by version: the engine that will run the simulated nodes' kubelets on the real control plane.
#
#   tools/build-kwok.sh [v0.8.0]       # prints the directory holding bin/kwok and stages.yaml
#
# kwok's go.mod has no replace directives, so `go install ...@version` builds it as released. kwok does nothing
# without Stage objects; stages.yaml is assembled from the stages the kwok module itself ships
# (kustomize/stage/...: node initialisation, lease heartbeats, the "general" pod lifecycle with its delays),
# read from the module cache, so nothing of kwok is copied into this project.
set -euo pipefail
version=${1:-v0.8.0}
[[ $version =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]] || { echo "not a kwok release tag: $version (e.g. v0.8.0)" >&2; exit 2; }
cache=${RUNBOOK_TOOLS_CACHE:-$HOME/.cache/talos-gpu-runbooks}/kwok/$version
if [[ -x $cache/bin/kwok && -s $cache/stages.yaml ]]; then echo "$cache"; exit 0; fi
command -v go >/dev/null || { echo "go is not installed (needed to build kwok $version)" >&2; exit 2; }
export GOTOOLCHAIN=local GOFLAGS=${GOFLAGS:--p=1}
mkdir -p "$cache"
GOBIN=$cache/bin nice -n 10 go install "sigs.k8s.io/kwok/cmd/kwok@$version"
dir=$(cd "$cache" && go mod download -json "sigs.k8s.io/kwok@$version" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
stages=(node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease pod/general/pod-create
  pod/general/pod-init-container-running pod/general/pod-init-container-completed pod/general/pod-ready
  pod/general/pod-complete pod/general/pod-delete)
for stage in "${stages[@]}"; do printf -- '---\n'; cat "$dir/kustomize/stage/$stage.yaml"; done >"$cache/stages.yaml.tmp"
mv "$cache/stages.yaml.tmp" "$cache/stages.yaml"
echo "$cache"
