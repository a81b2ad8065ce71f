#!/usr/bin/env bash
# Builds the real tool binaries Oasis runs beside its own from their tools modules
# (tools/<module>/go.mod) once, keeps them in a cache outside the checkout keyed by version and
# go.sum, and links them into bin/:
#
#   scripts/hashistack.sh                          every tool (make hashistack, make test)
#   scripts/hashistack.sh nomad consul prometheus  only the tools named (make up)
#
# Tools: nomad, consul, cni (the CNI plugins Nomad's bridge networking runs, linked as the
# directory bin/cni, the client's cni_path), tofu, tflint, jaeger, prometheus, promtool, llama-server
# (llama.cpp's server on CPU, C++ built with cmake, linked with its source as bin/llama-server and
# bin/llama.cpp), nomad-autoscaler (the Nomad Autoscaler with its built-in Prometheus APM, Nomad
# target and target-value/threshold strategies: `make up AUTOSCALE=1`, test/e2e/autoscale).
# A fresh clone on the same machine (how CI runs) reuses the cache; a cold build takes minutes,
# and says every 15 s that it is still going.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${OASIS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/oasis}
all=(nomad consul cni tofu tflint jaeger prometheus promtool nomad-autoscaler llama-server)

tools=("$@")
[ ${#tools[@]} -gt 0 ] || tools=("${all[@]}")
for t in "${tools[@]}"; do
	case " ${all[*]} " in
	*" $t "*) ;;
	*) echo "hashistack: unknown tool '$t' (one of: ${all[*]})" >&2; exit 2 ;;
	esac
done
mkdir -p "$root/bin" "$cache"

# A ticker says, every 15 s, what is still building and for how long, so that a cold build (many
# minutes of a silent compiler) does not look like a hang. Only one runs at a time.
ticker=
start_ticker() {
	local what=$1 since
	since=$(date +%s)
	(
		# sleep's output goes nowhere: a sleep left over after the ticker stops holds no pipe open.
		while sleep 15 </dev/null >/dev/null 2>&1; do
			echo "hashistack:   $what: $(($(date +%s) - since)) s ..."
		done
	) &
	ticker=$!
}
stop_ticker() {
	if [ -n "$ticker" ]; then
		kill "$ticker" 2>/dev/null || true
		wait "$ticker" 2>/dev/null || true
		ticker=
	fi
}
trap stop_ticker EXIT

# lock FILE WHAT: takes the build lock on fd 9, saying so when another checkout holds it (one build
# at a time per binary, even when several checkouts ask at once).
lock() {
	exec 9>"$1"
	if ! flock -n 9; then
		echo "hashistack: waiting for another build of $2 (a checkout building it now) ..."
		start_ticker "still waiting for $2"
		flock 9
		stop_ticker
	fi
}

# compile NAME VERSION DIR COMMAND...: runs the build command with progress lines.
compile() {
	local name=$1 version=$2 dir=$3
	shift 3
	echo "hashistack: building $name $version (once: cached in $dir for every later run and clone; a cold build takes minutes) ..."
	local start=$SECONDS
	start_ticker "still building $name"
	"$@"
	stop_ticker
	echo "hashistack: built $name $version in $((SECONDS - start)) s"
}

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
		lock "$dir/.lock" "$name"
		if [ ! -x "$out" ]; then
			compile "$name" "$version" "$dir" go_build "$mod" "$tags" "$ldflags" "$out.tmp" "$target"
			mv "$out.tmp" "$out"
		fi
		exec 9>&-
	fi
	ln -sfn "$out" "$root/bin/$name"
}

go_build() {
	local mod=$1 tags=$2 ldflags=$3 out=$4 target=$5
	(cd "$mod" && GOFLAGS=-mod=readonly go build -trimpath ${tags:+-tags "$tags"} ${ldflags:+-ldflags "$ldflags"} -o "$out" "$target")
}

# go_build_static MODULE DIR PACKAGE...: static binaries (the CNI plugins run as root from the
# client, on any host libc) into DIR.
go_build_static() {
	local mod=$1 out=$2
	shift 2
	(cd "$mod" && CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath -o "$out/" "$@")
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
		lock "$dir.lock" "the cni plugins"
		if [ ! -f "$dir.complete" ]; then
			local plugins
			plugins=$(awk '$1 == "tool" && $2 != "(" { print $2 } $1 == "tool" && $2 == "(" { in_tool = 1; next } in_tool && $1 == ")" { in_tool = 0 } in_tool { print $1 }' "$mod/go.mod")
			rm -rf "$dir" "$dir.tmp"
			mkdir -p "$dir.tmp"
			# shellcheck disable=SC2086 # one word per plugin package
			compile "cni plugins" "$version" "$dir" go_build_static "$mod" "$dir.tmp" $plugins
			mv "$dir.tmp" "$dir"
			touch "$dir.complete"
		fi
		exec 9>&-
	fi
	ln -sfn "$dir" "$root/bin/cni"
}

# llama-server: llama.cpp's OpenAI-compatible server, the real engine test/e2e/llamacpp runs, built
# for CPU from the llama.cpp source that the npm package node-llama-cpp ships as a git bundle (the
# one copy of llama.cpp's source this machine can fetch). Pinned by the npm version, the bundle's
# sha256 and the commit it holds. The cache keeps the binary and the source without its build
# (gguf-py, models/ggml-vocab-*.gguf and models/templates/, which cmd/oasis-tinymodel reads to make
# the test model), linked as bin/llama-server and bin/llama.cpp. OASIS_BUILD_JOBS: compile jobs
# (default: every core); the compilers run at nice 15.
llama_npm=node-llama-cpp@3.21.1
llama_bundle_sha256=9336d8aab8f8e6a8919380f3641fe92e57b02fb55df1b6bd083b82491a6293b8
llama_commit=80fb11ac73e66d89eae2c6a91d8a77428fa733ed
build_llama_server() {
	local version="${llama_npm#*@}-${llama_commit:0:7}"
	local dir="$cache/llama-server-$version"
	if [ -x "$dir/llama-server" ]; then
		echo "hashistack: llama-server $version cached at $dir/llama-server"
	else
		lock "$dir.lock" llama-server
		if [ ! -x "$dir/llama-server" ]; then
			compile llama-server "$version" "$dir" llama_server_build "$dir.tmp"
			rm -rf "$dir"
			mv "$dir.tmp" "$dir"
		fi
		exec 9>&-
	fi
	ln -sfn "$dir/llama-server" "$root/bin/llama-server"
	ln -sfn "$dir/src" "$root/bin/llama.cpp"
}

llama_server_build() {
	local out=$1 t
	for t in npm cmake g++ make; do
		command -v "$t" >/dev/null 2>&1 || { echo "hashistack: llama-server needs $t (make deps installs it)" >&2; return 1; }
	done
	rm -rf "$out"
	mkdir -p "$out"
	(cd "$out" && npm pack --silent "$llama_npm" >/dev/null)
	tar -xzf "$out"/*.tgz -C "$out" package/llama/gitRelease.bundle
	echo "$llama_bundle_sha256  $out/package/llama/gitRelease.bundle" | sha256sum -c --quiet ||
		{ echo "hashistack: $llama_npm's gitRelease.bundle is not the pinned one" >&2; return 1; }
	git -c advice.detachedHead=false clone -q "$out/package/llama/gitRelease.bundle" "$out/src"
	if [ "$(git -C "$out/src" rev-parse HEAD)" != "$llama_commit" ]; then
		echo "hashistack: the bundle holds llama.cpp $(git -C "$out/src" rev-parse HEAD), not $llama_commit" >&2
		return 1
	fi
	cmake -S "$out/src" -B "$out/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF \
		-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF >"$out/cmake.log" 2>&1 ||
		{ cat "$out/cmake.log" >&2; return 1; }
	nice -n 15 cmake --build "$out/build" --target llama-server -j "${OASIS_BUILD_JOBS:-$(nproc)}" >"$out/build.log" 2>&1 ||
		{ tail -n 60 "$out/build.log" >&2; return 1; }
	cp "$out/build/bin/llama-server" "$out/llama-server"
	rm -rf "$out/build" "$out/src/.git" "$out/package" "$out"/*.tgz "$out/cmake.log" "$out/build.log"
}

# Prometheus 3 with only the service discovery Oasis uses (Consul, Nomad): a smaller, faster build.
prom_tags=remove_all_sd,enable_consul_sd,enable_nomad_sd
for t in "${tools[@]}"; do
	case $t in
	# -s -w: no symbol table or DWARF; the linker writes them for minutes' worth of the cold build
	# (Nomad: 20 s of link → 6 s) and nothing here reads them (panics still name their functions).
	nomad) build nomad github.com/hashicorp/nomad ui github.com/hashicorp/nomad "-s -w" ;;
	consul) build consul github.com/hashicorp/consul "" github.com/hashicorp/consul "-s -w" ;;
	cni) build_cni ;;
	llama-server) build_llama_server ;;
	# version.dev=no: without it a release build reports itself as a development build.
	tofu) build tofu github.com/opentofu/opentofu "" github.com/opentofu/opentofu/cmd/tofu \
		"-s -w -X github.com/opentofu/opentofu/version.dev=no" ;;
	tflint) build tflint github.com/terraform-linters/tflint "" github.com/terraform-linters/tflint "-s -w" ;;
	# The trace backend (`make up TRACING=1`, test/e2e/tracing): all-in-one, OTLP in, memory storage.
	jaeger) build jaeger github.com/jaegertracing/jaeger "" github.com/jaegertracing/jaeger/cmd/jaeger "-s -w" ;;
	prometheus) build prometheus github.com/prometheus/prometheus "$prom_tags" github.com/prometheus/prometheus/cmd/prometheus "-s -w" ;;
	# An external program beside Oasis (MPL-2.0), never linked into it: its own tools module.
	# GitDescribe: without it the release reports itself as v0.4.7-dev.
	nomad-autoscaler) build nomad-autoscaler github.com/hashicorp/nomad-autoscaler "" github.com/hashicorp/nomad-autoscaler \
		"-s -w -X github.com/hashicorp/nomad-autoscaler/version.GitDescribe=v$(awk '$1 == "github.com/hashicorp/nomad-autoscaler" { sub(/^v/, "", $2); print $2; exit }' "$root/tools/nomad-autoscaler/go.mod")" ;;
	promtool) build promtool github.com/prometheus/prometheus "$prom_tags" github.com/prometheus/prometheus/cmd/promtool "-s -w" prometheus ;;
	esac
done

# First line of each version; no `| head`, whose early exit would SIGPIPE the binary under pipefail.
for t in "${tools[@]}"; do
	case $t in
	nomad | consul) v=$("$root/bin/$t" version) ;;
	# An empty CLI configuration: tofu warns on stderr when TF_CLI_CONFIG_FILE names a missing file.
	tofu) v=$(TF_CLI_CONFIG_FILE=/dev/null "$root/bin/tofu" version) ;;
	tflint) v=$("$root/bin/tflint" --version) ;;
	nomad-autoscaler) v=$("$root/bin/nomad-autoscaler" version) ;;
	# "version: 0.4.0-dev (build 1, commit 80fb11a)" and the compiler, on stderr.
	llama-server)
		v=$("$root/bin/llama-server" --version 2>&1 || true)
		v="llama-server $(printf '%s\n' "$v" | sed -n 's/^version: //p') from $llama_npm"
		;;
	*) continue ;;
	esac
	echo "${v%%$'\n'*}"
done
