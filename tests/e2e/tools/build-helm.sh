#!/usr/bin/env bash
# Builds helm of one released version from the Go module helm.sh/helm/v3, through the Go module proxy,
# into a cache outside the clone:  build-helm.sh VERSION   (e.g. v3.22.0)
#
# The program lands in $GPUPACK_HELM_CACHE/VERSION/helm (default ~/.cache/gpupack/helm/VERSION/helm);
# one already there is kept, so a second run costs nothing. helm's go.mod has no replace directives,
# so `go install module@version` builds it as released. The -X flags stamp what helm's own Makefile
# does and a module build leaves empty: the version `helm version` prints, and the Kubernetes version
# that `helm template` and `helm lint` assume without --kube-version (client-go v0.X.Y is Kubernetes
# 1.X; unstamped, helm assumes 1.20).
set -euo pipefail

version=${1:?usage: build-helm.sh VERSION}
[[ $version =~ ^v3\.[0-9]+\.[0-9]+$ ]] || { echo "build-helm.sh: '$version' is not a helm 3 release like v3.22.0" >&2; exit 2; }

cache=${GPUPACK_HELM_CACHE:-$HOME/.cache/gpupack/helm}
dest=$cache/$version
[ -x "$dest/helm" ] && exit 0

command -v go >/dev/null || { echo "build-helm.sh: needs Go (https://go.dev/doc/install) and the Go module proxy" >&2; exit 2; }

started=$(date +%s)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$dest"
echo "build-helm.sh: building helm $version into $dest" >&2
export GOTOOLCHAIN=local CGO_ENABLED=0
gomod=$(cd "$work" && go mod download -json "helm.sh/helm/v3@$version" | sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p')
kube_minor=$(sed -n 's#^\tk8s.io/client-go v0\.\([0-9]*\)\..*#\1#p' "$gomod")
[ -n "$kube_minor" ] || { echo "build-helm.sh: no k8s.io/client-go in helm $version's go.mod" >&2; exit 1; }
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$version"
for package in pkg/lint/rules pkg/chartutil; do
    ldflags+=" -X helm.sh/helm/v3/$package.k8sVersionMajor=1 -X helm.sh/helm/v3/$package.k8sVersionMinor=$kube_minor"
done
GOBIN=$work go install -trimpath -ldflags "$ldflags" "helm.sh/helm/v3/cmd/helm@$version"
mv "$work/helm" "$dest/helm.tmp"
mv "$dest/helm.tmp" "$dest/helm"
echo "build-helm.sh: built helm $version in $(( $(date +%s) - started )) s" >&2
