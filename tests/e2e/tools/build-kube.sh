#!/usr/bin/env bash
# Builds Kubernetes programs of one released version from the Go module k8s.io/kubernetes, through
# the Go module proxy, into a cache outside the clone:  build-kube.sh VERSION [PROGRAM ...]
#
#   VERSION   a released version, e.g. v1.37.2
#   PROGRAM   kube-apiserver kube-scheduler kubelet kubectl (the default: all four)
#
# The programs land in $GPUPACK_KUBE_CACHE/VERSION/ (default ~/.cache/gpupack/kube/VERSION); a program
# already there is kept, so a second run costs nothing. `go install module@version` refuses
# k8s.io/kubernetes because its go.mod replaces the k8s.io/* staging modules with local folders, so a
# throw-away wrapper module requires it and replaces each staging module with its published v0.X.Y.
set -euo pipefail

version=${1:?usage: build-kube.sh VERSION [PROGRAM ...]}
shift
[[ $version =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] || { echo "build-kube.sh: '$version' is not a release like v1.37.2" >&2; exit 2; }
minor=${BASH_REMATCH[1]}
patch=${BASH_REMATCH[2]}
programs=("$@")
[ ${#programs[@]} -gt 0 ] || programs=(kube-apiserver kube-scheduler kubelet kubectl)

command -v go >/dev/null || { echo "build-kube.sh: needs Go (https://go.dev/doc/install) and the Go module proxy" >&2; exit 2; }

cache=${GPUPACK_KUBE_CACHE:-$HOME/.cache/gpupack/kube}
dest=$cache/$version
mkdir -p "$dest"
missing=()
for program in "${programs[@]}"; do
    [ -x "$dest/$program" ] || missing+=("$program")
done
[ ${#missing[@]} -gt 0 ] || exit 0

started=$(date +%s)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0

gomod=$(cd "$work" && go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p')
[ -f "$gomod" ] || { echo "build-kube.sh: the Go module proxy did not serve k8s.io/kubernetes@$version" >&2; exit 1; }
{
    echo "module gpupack.local/kube-build"
    sed -n 's/^go \([0-9.]*\)$/go \1/p' "$gomod"
    echo "require k8s.io/kubernetes $version"
    sed -n "s#^\t\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#replace \1 => \1 v0.$minor.$patch#p" "$gomod"
} > "$work/go.mod"

ldflags="-s -w"
for key_value in "gitVersion=$version" "gitMajor=1" "gitMinor=$minor" "gitTreeState=clean" \
        "buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"; do
    ldflags+=" -X k8s.io/component-base/version.$key_value -X k8s.io/client-go/pkg/version.$key_value"
done

cd "$work"
for program in "${missing[@]}"; do
    echo "build-kube.sh: building $program $version into $dest" >&2
    go build -trimpath -ldflags "$ldflags" -o "$dest/$program.tmp" "k8s.io/kubernetes/cmd/$program"
    mv "$dest/$program.tmp" "$dest/$program"
done
echo "build-kube.sh: built ${missing[*]} $version in $(( $(date +%s) - started )) s" >&2
