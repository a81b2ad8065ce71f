#!/usr/bin/env bash
# Builds the release tarballs dist/oasis_<version>_linux_<arch>.tar.gz and dist/SHA256SUMS.
# Each tarball holds the binaries, Oasis's LICENSE and THIRD_PARTY_LICENSES (every Go module linked
# into those binaries, its version, licence and licence text).
#
# Version: $OASIS_VERSION, else `git describe --tags --always --dirty` (a tag once the project tags
# releases, the commit otherwise; "-dirty" marks uncommitted changes).
# DIST_ARCHES (default "amd64 arm64"), DIST_CMDS (default every command below) and DIST_DIR
# (default dist/) narrow or move a build; the test of this script uses them.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
version=${OASIS_VERSION:-$(git describe --tags --always --dirty)}
arches=${DIST_ARCHES:-amd64 arm64}
cmds=${DIST_CMDS:-oasis-router oasis-kvcached oasis-sim oasis-autoscaler-strategy nomad-driver-llm nomad-device-gpu}
out=${DIST_DIR:-$root/dist}
host_arch=$(go env GOARCH)

# Commands that need cgo: the device plugin binds libnvidia-ml through go-nvml's cgo dlopen.
cgo_cmds=" nomad-device-gpu "

# build_cmd CMD ARCH DIR: static binaries, except the cgo commands, which build only where a C
# compiler for ARCH exists (the host's own architecture): they are left out of other tarballs.
build_cmd() {
	local cmd=$1 arch=$2 dir=$3 cgo=0
	if [[ $cgo_cmds == *" $cmd "* ]]; then
		if [ "$arch" != "$host_arch" ]; then
			echo "dist: skipping $cmd for linux/$arch: it needs cgo and there is no C cross compiler" >&2
			return 0
		fi
		cgo=1
	fi
	CGO_ENABLED=$cgo GOOS=linux GOARCH=$arch go build -trimpath -ldflags "-s -w" -o "$dir/$cmd" "./cmd/$cmd"
}

# package DIR TARBALL: the same inputs give the same bytes (sorted names, fixed time and owner,
# no gzip timestamp), so a rebuild of one commit keeps its checksums.
package() {
	local dir=$1 tarball=$2 files
	files=$(cd "$dir" && ls)
	# shellcheck disable=SC2086 # file names are command names, without spaces
	tar -C "$dir" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf - $files | gzip -n -9 >"$tarball.tmp"
	mv "$tarball.tmp" "$tarball"
}

mkdir -p "$out"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
# The licence check runs on this machine (built for it) and lists the modules of each target's build:
# GOOS/GOARCH in its environment reach the `go list` it runs.
go build -o "$stage/licensecheck" ./internal/licenses/cmd/licensecheck
tarballs=()
for arch in $arches; do
	start=$SECONDS
	mkdir -p "$stage/$arch"
	pkgs=()
	for cmd in $cmds; do
		build_cmd "$cmd" "$arch" "$stage/$arch"
		[ -e "$stage/$arch/$cmd" ] && pkgs+=("./cmd/$cmd")
	done
	# Oasis's own licence, and the licences of every module linked into these binaries
	# (the check fails the build on a module Oasis may not link).
	install -m 0644 LICENSE "$stage/$arch/LICENSE"
	GOOS=linux GOARCH=$arch "$stage/licensecheck" -notice "$stage/$arch/THIRD_PARTY_LICENSES" "${pkgs[@]}" >/dev/null
	chmod 0644 "$stage/$arch/THIRD_PARTY_LICENSES"
	name="oasis_${version}_linux_${arch}.tar.gz"
	package "$stage/$arch" "$out/$name"
	tarballs+=("$name")
	echo "dist: $name ($(du -h "$out/$name" | cut -f1), $((SECONDS - start))s)"
done
(cd "$out" && sha256sum "${tarballs[@]}" >SHA256SUMS)
echo "dist: $out/SHA256SUMS"
