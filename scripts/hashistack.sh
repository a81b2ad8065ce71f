#!/usr/bin/env bash
# Builds the real nomad, consul, tofu, tflint, jaeger, prometheus and promtool binaries from their tools modules (tools/<name>/go.mod) once,
# keeps them in a cache outside the checkout keyed by version and go.sum, and links them into bin/.
# The CNI plugins Nomad's bridge networking runs (tools/cni) are cached the same way and linked as
# the directory bin/cni, the client's cni_path.
# A fresh clone on the same machine (how CI runs) reuses the cache; a cold build takes minutes.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${OASIS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/oasis}
mkdir -p "$root/bin" "$cache"

# build NAME MODULE TAGS [PACKAGE [LDFLAGS [TOOLS]]]: MODULE names the version in go.mod; PACKAGE is the
# main package when it is not the module's root; TOOLS is the directory under tools/ when it is not NAME
# (one tools module builds several binaries).
build() {
	local name=$1 pkg=$2 tags=$3 target=${4:-$2} ldflags=${5:-}
	local mod="$root/tools/${6:-$name}"
	local version
	version=$(awk -v p="$pkg" '$1 == p { print $2; exit }' "$mod/go.mod")
	if [ -z "$version" ]; then
		version=$(awk -v p="$pkg" '$1 == "require" && $2 == p { print $3; exit }' "$mod/go.mod")
	fi
	[ -n "$version" ] || { echo "hashistack: no version of $pkg in $mod/go.mod" >&2; exit 1; }
	local key
	key=$(cat "$mod/go.mod" "$mod/go.sum" | sha256sum | cut -c1-12)
	local dir="$cache/$name-$version-$key"
	local out="$dir/$name"
	if [ -x "$out" ]; then
		echo "hashistack: $name $version cached at $out"
	else
		mkdir -p "$dir"
		# One build at a time per binary, even when several checkouts ask at once.
		exec 9>"$dir/.lock"
		flock 9
		if [ ! -x "$out" ]; then
			echo "hashistack: building $name $version (a cold build takes minutes) ..."
			local start=$SECONDS
			(cd "$mod" && GOFLAGS=-mod=readonly go build -trimpath ${tags:+-tags "$tags"} ${ldflags:+-ldflags "$ldflags"} -o "$out.tmp" "$target")
			mv "$out.tmp" "$out"
			echo "hashistack: built $name $version in $((SECONDS - start))s"
		fi
		exec 9>&-
	fi
	ln -sfn "$out" "$root/bin/$name"
}

# build_cni builds every plugin the tools module lists into one cached directory: Nomad's client
# looks plugins up by file name in cni_path, so they must sit side by side.
build_cni() {
	local mod="$root/tools/cni" pkg=github.com/containernetworking/plugins
	local version key
	version=$(awk -v p="$pkg" '$1 == p { print $2; exit }' "$mod/go.mod")
	[ -n "$version" ] || { echo "hashistack: no version of $pkg in $mod/go.mod" >&2; exit 1; }
	key=$(cat "$mod/go.mod" "$mod/go.sum" | sha256sum | cut -c1-12)
	local dir="$cache/cni-$version-$key"
	# Marker and lock sit beside the directory: Nomad's client lists every file in cni_path.
	if [ -f "$dir.complete" ]; then
		echo "hashistack: cni plugins $version cached at $dir"
	else
		exec 9>"$dir.lock"
		flock 9
		if [ ! -f "$dir.complete" ]; then
			echo "hashistack: building cni plugins $version ..."
			local start=$SECONDS tools
			tools=$(awk '$1 == "tool" && $2 != "(" { print $2 } $1 == "tool" && $2 == "(" { in_tool = 1; next } in_tool && $1 == ")" { in_tool = 0 } in_tool { print $1 }' "$mod/go.mod")
			rm -rf "$dir" "$dir.tmp"
			mkdir -p "$dir.tmp"
			# Static binaries: the plugins run as root from the client, on any host libc.
			(cd "$mod" && CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath -o "$dir.tmp/" $tools)
			mv "$dir.tmp" "$dir"
			touch "$dir.complete"
			echo "hashistack: built cni plugins $version in $((SECONDS - start))s"
		fi
		exec 9>&-
	fi
	ln -sfn "$dir" "$root/bin/cni"
}

build nomad github.com/hashicorp/nomad ui
build consul github.com/hashicorp/consul ""
build_cni
# version.dev=no: without it a release build reports itself as a development build.
build tofu github.com/opentofu/opentofu "" github.com/opentofu/opentofu/cmd/tofu \
	"-s -w -X github.com/opentofu/opentofu/version.dev=no"
build tflint github.com/terraform-linters/tflint "" github.com/terraform-linters/tflint "-s -w"
# The trace backend (`make up TRACING=1`, test/e2e/tracing): all-in-one, OTLP in, memory storage.
build jaeger github.com/jaegertracing/jaeger "" github.com/jaegertracing/jaeger/cmd/jaeger "-s -w"
# Prometheus 3 with only the service discovery Oasis uses (Consul, Nomad): a smaller, faster build.
prom_tags=remove_all_sd,enable_consul_sd,enable_nomad_sd
build prometheus github.com/prometheus/prometheus "$prom_tags" github.com/prometheus/prometheus/cmd/prometheus "-s -w"
build promtool github.com/prometheus/prometheus "$prom_tags" github.com/prometheus/prometheus/cmd/promtool "-s -w" prometheus
# First line of each version; no `| head`, whose early exit would SIGPIPE the binary under pipefail.
for bin in nomad consul; do
	v=$("$root/bin/$bin" version)
	echo "${v%%$'\n'*}"
done
# An empty CLI configuration: tofu warns on stderr when TF_CLI_CONFIG_FILE names a missing file.
v=$(TF_CLI_CONFIG_FILE=/dev/null "$root/bin/tofu" version)
echo "${v%%$'\n'*}"
v=$("$root/bin/tflint" --version)
echo "${v%%$'\n'*}"
