# Oasis: LLM inference orchestration native to Nomad and Consul.
#
#   make up      the whole local stack (Consul + Nomad + Oasis jobs on the simulator)
#   make test    everything CI runs
#
# Real nomad and consul binaries are built once from tools/<name> and cached under
# $(XDG_CACHE_HOME or ~/.cache)/oasis; bin/ links to them.

GO        ?= go
GOFLAGS   ?=
PKGS_UNIT  = $(shell $(GO) list ./... | grep -v '/test/e2e') ./test/e2e/testbed
PKGS_E2E   = $(shell $(GO) list ./test/e2e/... | grep -v '/testbed$$' | grep -v '/cmd/')
STATICCHECK = bin/staticcheck

export GOFLAGS

.PHONY: all build dist deps hashistack licenses test unit e2e vet lint terraform-check terraform-provider bench bench-sim bench-routing bench-routing-library bench-llamacpp bench-federation bench-routers bench-disagg bench-autoscale bench-router bench-router-proxy-bound bench-mesh soak bench-kvcached bench-driver fuzz up down clean gpu-check observability-check proto

all: build

## build: compile every Oasis command into bin/
build:
	@mkdir -p bin
	GOBIN=$(CURDIR)/bin $(GO) install ./cmd/...   # install, not build: an up-to-date binary is not linked again

## dist: release tarballs dist/oasis_<version>_linux_{amd64,arm64}.tar.gz and dist/SHA256SUMS
dist:
	@scripts/dist.sh

## terraform-provider: terraform-provider-oasis into a filesystem mirror, dist/terraform-mirror/ (terraform/README.md)
PROVIDER_VERSION = $(shell sed -n 's/^[[:space:]]*DefaultVersion = "\(.*\)"/\1/p' terraform/provider/provider.go)
PROVIDER_DIR     = dist/terraform-mirror/registry.opentofu.org/oasis-llm/oasis/$(PROVIDER_VERSION)/$(shell $(GO) env GOOS)_$(shell $(GO) env GOARCH)
terraform-provider:
	@mkdir -p $(PROVIDER_DIR)
	$(GO) build -trimpath -o $(PROVIDER_DIR)/terraform-provider-oasis_v$(PROVIDER_VERSION) ./cmd/terraform-provider-oasis

## hashistack: build (once) and link every tool tests run: bin/nomad, bin/consul, bin/tofu, bin/tflint, bin/jaeger,
## bin/prometheus, bin/promtool, bin/nomad-autoscaler (test/e2e/autoscale), the CNI plugins in bin/cni and llama.cpp's bin/llama-server with its source in
## bin/llama.cpp (test/e2e/llamacpp) (scripts/hashistack.sh NAME... builds only those)
hashistack:
	@scripts/hashistack.sh

## deps: Debian packages tests talk to (redis-tools, redis-server, nginx, iptables), installed if missing
deps:
	@scripts/deps.sh

## test: everything CI runs — vet, staticcheck, the licence check, the Terraform checks, unit tests, e2e against real Nomad + Consul
## (scripts/test.sh: the targets below, with the tools only some e2e packages use built in the background
## and those packages run last, so that a cold run stays short)
test:
	@scripts/test.sh

## licenses: every module in the Go module graphs of the root module and bench/llmd has a licence
## Oasis may link (its own licence files, read and classified; BUSL, SSPL, AGPL, unknown = fail, named)
licenses:
	@mkdir -p bin
	$(GO) build -o bin/licensecheck ./internal/licenses/cmd/licensecheck
	bin/licensecheck
	cd bench/llmd && ../../bin/licensecheck

## unit: every package outside test/e2e, and the test bed's own unit tests; no Nomad agent, Consul dev agents (bin/consul) for the Consul-backed tests
unit:
	$(GO) test -count=1 -timeout 15m $(PKGS_UNIT)

## e2e: tests against the real Nomad + Consul test bed (one stack per package, E2E_PARALLEL packages at a
## time, default 2); the commands are built once into bin/ and every stack copies them
E2E_PARALLEL ?= 2
e2e: deps hashistack build
	OASIS_TESTBED_PREBUILT=$(CURDIR)/bin $(GO) test -count=1 -p $(E2E_PARALLEL) -timeout 30m $(PKGS_E2E)

vet:
	$(GO) vet ./...
	cd bench/llmd && GOFLAGS=-mod=readonly $(GO) vet ./...   # its own module (llm-d's index): kept building

$(STATICCHECK): tools/staticcheck/go.mod tools/staticcheck/go.sum
	@mkdir -p bin
	cd tools/staticcheck && GOFLAGS=-mod=readonly $(GO) build -o ../../$(STATICCHECK) honnef.co/go/tools/cmd/staticcheck

## lint: gofmt, go vet and pinned staticcheck
lint: vet $(STATICCHECK)
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(STATICCHECK) ./...

## terraform-check: tofu fmt -check, tflint (terraform ruleset, recommended) on every directory of .tf files
## under terraform/, and tofu test of the modules that have tests (offline; the aws and gcp modules get
## fmt and tflint only: their providers cannot be installed here)
terraform-check:
	@scripts/hashistack.sh tofu tflint
	@scripts/terraform-check.sh

## observability-check: promtool checks the shipped scrape configuration and alerting rules, and
## runs the rules' unit tests (observability/alerts_test.yml fires every alert)
observability-check:
	@scripts/hashistack.sh promtool
	cd observability && ../bin/promtool check config prometheus.yml
	bin/promtool check rules observability/alerts.yml
	cd observability && ../bin/promtool test rules alerts_test.yml

## bench: Go benchmarks of every package (bounded); peer comparisons are scripts in bench/
bench:
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 2000x $(PKGS_UNIT)

## bench-sim: oasis-sim throughput (streaming, --speed 0) and RSS with 100k cached blocks
bench-sim: build
	$(GO) run ./sim/simload -sim bin/oasis-sim -c 64 -d 10s
	$(GO) run ./sim/simload -sim bin/oasis-sim -fill-blocks 100000

## bench-routing: cluster simulator on a trace (TRACE=<file, library name or gen:NAME[:knobs]>, WORKERS=<n>): Oasis beside random, round_robin, least_load,
## prefix and the peers' published algorithms (llmd, dynamo, sglang, aibrix, prodstack), throughput at SLO (TTFT p90 2 s,
## TPOT p90 100 ms) by bisection; table, bench/out/routing.json and .png
## (CPU_GIB / DISK_GIB: host-memory and kvcached SSD KV tiers per worker; 0 for GPU KV only; ROUTING_LIMIT=n: the
## first n requests, 0 all; ROUTING_BISECT: bisection steps per policy; ROUTING_FLAGS: more flags, e.g. -learning approx)
TRACE    ?= bench/cluster/traces/mooncake-conversation.jsonl.gz
WORKERS  ?= 16
CPU_GIB  ?= 256
DISK_GIB ?= 2048
ROUTING_LIMIT  ?= 0
ROUTING_BISECT ?= 3
ROUTING_FLAGS  ?=
bench-routing:
	$(GO) run ./bench/cluster/cmd/bench-routing -trace $(TRACE) -workers $(WORKERS) -cpu-gib $(CPU_GIB) -disk-gib $(DISK_GIB) -scales 0.5,1,2,3,4 \
		-limit $(ROUTING_LIMIT) -bisect $(ROUTING_BISECT) $(ROUTING_FLAGS) -out bench/out

## bench-routing-library: bench-routing on every entry of the trace library (published traces and generators;
## `go run ./bench/cluster/cmd/bench-routing -list` lists them; TRACE=<name>, TRACE=gen:rag or gen:rag:docs=200,zipf=1.4
## runs one), each into bench/out/library/<name>/, then the cross-validation table (same knobs as bench-routing)
bench-routing-library:
	$(GO) run ./bench/cluster/cmd/bench-routing -library all -workers $(WORKERS) -cpu-gib $(CPU_GIB) -disk-gib $(DISK_GIB) -scales 0.5,1,2,3,4 \
		-limit $(ROUTING_LIMIT) -bisect $(ROUTING_BISECT) $(ROUTING_FLAGS) -out bench/out/library

## bench-federation: cluster simulator, two datacenters on the trace: local-only vs best-prefix vs Oasis federation
## (the policy's default federation section; FED_FLAGS: more flags, e.g. -limit, -shift, -max-spill)
FED_FLAGS ?=
bench-federation:
	$(GO) run ./bench/cluster/cmd/bench-federation -trace $(TRACE) -dcs 2 -workers 4 -rtt 30ms -skew 0.8 \
		-scales 0.25,0.5,0.75,1,1.5,2 -bisect 3 -out bench/out $(FED_FLAGS)

## bench-routers: cluster simulator, 1, 4 and 16 Oasis routers over 16 H100s (one per node, each with its share of the
## arrivals), events and approximate learning, shared state off / loads / loads+prefix records: throughput at SLO and hit
## ratio; bench/out/routers.json (ROUTERS_FLAGS: more flags, e.g. -limit 0 for the whole trace)
ROUTERS_FLAGS ?= -limit 2000
bench-routers:
	$(GO) run ./bench/cluster/cmd/bench-routers -trace $(TRACE) -workers 16 -routers 1,4,16 -scales 1,2,4 -bisect 3 -out bench/out $(ROUTERS_FLAGS)

## bench-disagg: cluster simulator, 8 H100s aggregated vs xPyD prefill/decode pools on the trace: TTFT/TPOT p50/p90, goodput at SLO; bench/out/disagg.json, disagg-tpot.png, disagg-ttft.png
bench-disagg:
	$(GO) run ./bench/cluster/cmd/bench-disagg -trace $(TRACE) -gpus 8 -splits 0,2,4,5,6,7 -scales 1,2,3,3.5,4,4.5,5,5.5,6 -out bench/out

## bench-llamacpp: four real llama-server engines (the llm driver, the real test bed), four tenants sharing a
## long system prompt each, at once: TTFT p50/p90 and cache reuse, default policy vs round_robin in one run
bench-llamacpp: build hashistack
	OASIS_TESTBED_PREBUILT=$(CURDIR)/bin $(GO) test -count=1 -run '^$$' -bench SharedPrefixTTFT -benchtime 1x -v ./test/e2e/llamacpp

## bench-autoscale: cluster simulator, one day of the Mooncake trace (day-shaped rate): GPU-hours and SLO attainment of a static
## fleet sized for the peak, the recipes' shipped scaling policy and a Dynamo-Planner-like one; bench/out/autoscale.json
bench-autoscale:
	$(GO) run ./bench/cluster/cmd/bench-autoscale -trace mooncake-conversation -day 30m -out bench/out

## bench-router: router (default policy) vs nginx in front of the same real-time engines, with TLS then without in one run: added latency at 1,000 streaming req/s, throughput, CPU per request (ROUTER_BASE_BIN=old build adds it)
bench-router: build deps
	BOTH=1 bench/router-vs-nginx.sh -rate 1000 -round 2s -rounds 5 -concurrency 64 -max-tokens 4

## bench-router-proxy-bound: throughput with engines that never wait (SIM_SPEED=0), so the proxies are the bottleneck; not the headline
bench-router-proxy-bound: build deps
	SIM_SPEED=0 BOTH=1 bench/router-vs-nginx.sh -phases throughput -round 2s -rounds 5 -concurrency 64 -max-tokens 4

## bench-mesh: router in the Consul service mesh (mTLS in, engines behind `consul connect proxy` sidecars) vs the plain router and direct, one run: added TTFT at 1,000 streaming req/s, CPU per request of routers and sidecars; round_robin so the policy's batching does not blur the difference (MESH_POLICY= for the shipped policy; PPROF=<s>: profile of the mesh router)
MESH_POLICY ?= {"policy":"round_robin"}
bench-mesh: hashistack
	POLICY_JSON='$(MESH_POLICY)' bench/router-mesh.sh -rate 1000 -round 2s -rounds 5 -max-tokens 4 -warmup-rate 1000

## bench-kvcached: redis-benchmark against kvcached and redis-server, and the tier/peer Go benchmarks
bench-kvcached: deps
	bench/kvcached-vs-redis.sh
	bench/kvcached-go.sh

## bench-driver: llm driver StartTask -> ready overhead and plugin RSS on the real test bed
bench-driver: hashistack
	$(GO) test -count=1 ./test/e2e/driver -run '^$$' -bench StartTaskToReady -benchtime 20x

## soak: the local stack under mixed load for SOAK_DURATION (default 10m): outcomes by cause, router and
## kvcached RSS and goroutines over time; fails on unbounded growth or a request lost without an error
SOAK_DURATION ?= 10m
soak: hashistack
	$(GO) run ./bench/soak -duration $(SOAK_DURATION)

## fuzz: a bounded run of each fuzz target
# FuzzRequestFraming's inputs are QUIC round trips: minimizing one with a 64 KiB
# key would take the whole run, so it minimizes once (-fuzzminimizetime 1x).
fuzz:
	$(GO) test -run '^$$' -fuzz FuzzParseRequest -fuzztime 60s ./router/openai
	$(GO) test -run '^$$' -fuzz FuzzWithoutRouterOwned -fuzztime 20s ./router/openai
	$(GO) test -run '^$$' -fuzz FuzzParseHostedPolicy -fuzztime 30s ./router/discovery
	$(GO) test -run '^$$' -fuzz FuzzHostedPolicyAllow -fuzztime 30s ./router/discovery
	$(GO) test -run '^$$' -fuzz FuzzMetricsPath -fuzztime 20s ./router/discovery
	$(GO) test -run '^$$' -fuzz FuzzReadCommand -fuzztime 60s ./kvcached/resp
	$(GO) test -run '^$$' -fuzz FuzzReaderPathsAgree -fuzztime 30s ./kvcached/resp
	$(GO) test -run '^$$' -fuzz FuzzDispatch -fuzztime 60s ./kvcached/server
	$(GO) test -run '^$$' -fuzz FuzzAPI -fuzztime 30s ./sim/server
	$(GO) test -run '^$$' -fuzz FuzzDecode -fuzztime 30s ./internal/kvevents
	$(GO) test -run '^$$' -fuzz FuzzRoundTrip -fuzztime 30s ./internal/tokenizer
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime 30s ./router/policy
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime 20s ./router/auth
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime 20s ./internal/agentconfig
	$(GO) test -run '^$$' -fuzz FuzzParseEngineMetrics -fuzztime 30s ./router/enginestats
	$(GO) test -run '^$$' -fuzz FuzzTaskConfig -fuzztime 30s ./nomad-driver/jobcheck
	$(GO) test -run '^$$' -fuzz FuzzParseFrames -fuzztime 20s ./internal/kvevents
	$(GO) test -run '^$$' -fuzz FuzzSequence -fuzztime 20s ./internal/kvevents
	$(GO) test -run '^$$' -fuzz FuzzRequestFraming -fuzztime 30s -fuzzminimizetime 1x ./kvcached/peer
	$(GO) test -run '^$$' -fuzz FuzzUnmarshalBloom -fuzztime 20s ./kvcached/peer

## proto: regenerate internal/nomadplugin/proto's Go code (protoc and its Go plugins:
## see scripts/protoc.sh); the generated files are committed
proto:
	scripts/protoc.sh

## gpu-check: on a machine with an NVIDIA GPU, run the built device plugin through Nomad's
## plugin client and print its fingerprint and two stats samples against real NVML
gpu-check:
	@mkdir -p bin
	$(GO) build -o bin/nomad-device-gpu ./cmd/nomad-device-gpu
	$(GO) run ./cmd/gpu-check -plugin bin/nomad-device-gpu -json

## up: start Consul + Nomad with the Oasis plugins and run jobs/ and the demo recipe
## (DCS=2: two federated datacenters, each running them in its own region, their routers federated
##  with certificates from a CA made at up and kept in .oasis/; prints how to see a request served
##  by the other datacenter;
##  MESH=1: in the Consul service mesh: bridge networking, intentions from jobs/mesh, the router
##  Connect-native, engines behind sidecars;
##  TRACING=1: a Jaeger all-in-one (bin/jaeger) the router exports its traces to; prints how to see one;
##  ENGINE=llama-cpp: the demo on real llama-server engines (recipes/tiny/llama-cpp/cpu) serving a tiny
##  random-weight model made at up, model tiny-llama;
##  AUTOSCALE=1: the Nomad Autoscaler (bin/nomad-autoscaler) acting on the demo recipe's scaling policy).
## It builds (once, cached like hashistack) only the tools it runs: nomad, consul, prometheus; the CNI
## plugins with MESH=1, jaeger with TRACING=1, llama-server with ENGINE=llama-cpp, nomad-autoscaler
## with AUTOSCALE=1.
up: $(if $(MESH)$(ENGINE),deps)
	@scripts/hashistack.sh nomad consul prometheus $(if $(MESH),cni) $(if $(TRACING),jaeger) $(if $(filter llama-cpp,$(ENGINE)),llama-server) $(if $(AUTOSCALE),nomad-autoscaler)
	@GOBIN=$(CURDIR)/bin $(GO) install ./cmd/...
	OASIS_TESTBED_PREBUILT=$(CURDIR)/bin $(GO) run ./test/e2e/cmd/oasis-stack up $(if $(DCS),-dcs $(DCS)) $(if $(MESH),-mesh) $(if $(TRACING),-tracing) $(if $(ENGINE),-engine $(ENGINE)) $(if $(AUTOSCALE),-autoscale)

## down: stop everything `make up` started
down:
	$(GO) run ./test/e2e/cmd/oasis-stack down

clean:
	rm -rf bin bench/out dist
