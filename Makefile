# helm-autorecover. `make demo` shows the whole story on a local control
# plane; `make test` runs every test, unit and integration.
SHELL := /usr/bin/env bash
GO ?= go
BIN := bin/helm-autorecover
# The project's version is internal/version.Version, in the source (plugin.yaml
# and the chart repeat it); the build stamps only the commit beside it.
COMMIT ?= $(shell git describe --always --dirty --exclude '*' 2>/dev/null)
HELM_VERSION := $(shell $(GO) list -m -f '{{.Version}}' helm.sh/helm/v4)
LDFLAGS := -X github.com/helm-autorecover/helm-autorecover/internal/version.GitCommit=$(COMMIT) \
	-X helm.sh/helm/v4/internal/version.version=$(HELM_VERSION)
GOLANGCI_LINT := $(shell $(GO) env GOPATH)/bin/golangci-lint
# The local control plane's folder (hack/local-cluster.sh): its kubeconfig is
# the one every target below hands to the tools, and the scripts and the tests
# read the same variable, so one value (absolute) serves them all.
LOCAL_CLUSTER_DIR := $(abspath $(or $(LOCAL_CLUSTER_DIR),$(CURDIR)/.local-cluster))
export LOCAL_CLUSTER_DIR
# Integration tests start processes and wait on them: generous, not infinite.
TEST_TIMEOUT ?= 40m

.PHONY: pg-up pg-down sim dist image docs build build-chaos chaos test test-unit test-integration lint fmt vet demo bench bench-controller cluster-up cluster-down cluster-bins helm4-bin tools promtool clean chart-lint fuzz

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/helm-autorecover

## build-chaos: the fault suite's binary, with the hooks of internal/chaos
## (kill points, a simulated clock offset); never shipped.
build-chaos:
	$(GO) build -tags chaos -ldflags "$(LDFLAGS)" -o bin/helm-autorecover-chaos ./cmd/helm-autorecover

## dist: archives for linux and darwin (.tar.gz) and windows (.zip) on
## amd64 and arm64, with checksums, in dist/ (hack/dist.sh): what
## `helm plugin install URL` and the plugin's install hook take on a
## machine without Go.
dist:
	LDFLAGS="$(LDFLAGS)" hack/dist.sh

## image: the controller's image for linux/amd64 and linux/arm64, one OCI
## index in an OCI archive (docker load, kind load image-archive; crane and
## skopeo push it: docs/controller.md), tagged
## ghcr.io/helm-autorecover/helm-autorecover:<version>, the chart's default;
## built without a container daemon (hack/image.sh, hack/image), the same
## archive for the same commit. IMAGE_OUT, IMAGE_REPOSITORY, IMAGE_PLATFORMS:
## see hack/image.sh.
image:
	LDFLAGS="$(LDFLAGS)" hack/image.sh

## docs: the parts of the docs generated from the code (hack/gendocs); make
## test fails when they are stale.
docs:
	$(GO) run ./hack/gendocs

## test: everything, against the real local control plane (built and started if needed).
test: build cluster-up
	$(GO) test -count=1 -timeout $(TEST_TIMEOUT) ./...

## test-unit: pure unit tests only; integration tests skip under -short.
test-unit:
	$(GO) test -short -count=1 ./...

## sim: the deterministic simulation (internal/sim, issue 17): the bounded
## exhaustive set and SIM_N random schedules from seed SIM_SEED, run by
## SIM_SHARDS processes (one per core) that take blocks of seeds in turn
## (sim-claims/), so that they end together; figures are appended to
## SIM_REPORT. A violation prints its seed, the command that replays it, and
## the schedule's trace, and fails the target. make test runs the
## exhaustive set, the regressions and the first 1,000 random schedules.
## SIM_GOGC trades memory for speed.
SIM_N ?= 100000
SIM_SEED ?= 1
SIM_SHARDS ?= 2
SIM_REPORT ?= sim-report.txt
SIM_GOGC ?= 400
sim:
	@rm -rf $(SIM_REPORT) sim-shard-*.log sim-exhaustive.log sim-claims && mkdir -p sim-claims bin
	$(GO) test -c -tags sim -o bin/sim.test ./internal/sim
	@set -e; cd internal/sim; \
		GOMAXPROCS=1 GOGC=$(SIM_GOGC) ../../bin/sim.test -test.count=1 -test.timeout 4h -test.run '^TestSimExhaustive$$' \
			-sim.report=$(CURDIR)/$(SIM_REPORT) > $(CURDIR)/sim-exhaustive.log 2>&1 & pids="$$!"; \
		i=0; while [ $$i -lt $(SIM_SHARDS) ]; do \
		GOMAXPROCS=1 GOGC=$(SIM_GOGC) ../../bin/sim.test -test.count=1 -test.timeout 8h -test.run '^TestSimRandom$$' \
			-sim.n=$(SIM_N) -sim.seed=$(SIM_SEED) -sim.claims=$(CURDIR)/sim-claims -sim.report=$(CURDIR)/$(SIM_REPORT) > $(CURDIR)/sim-shard-$$i.log 2>&1 & pids="$$pids $$!"; \
		i=$$((i+1)); done; rc=0; for p in $$pids; do wait $$p || rc=1; done; \
		cat $(CURDIR)/$(SIM_REPORT); grep -h -A3 -E 'violations( \(replay|:$$)' $(CURDIR)/sim-exhaustive.log $(CURDIR)/sim-shard-*.log | head -200 || true; exit $$rc

## fuzz: every fuzz target (func FuzzX in a *_test.go file under internal/
## and pkg/) for $(FUZZ_TIME) each, one after the other; a new target is
## picked up by itself. Crashers land in the package's testdata/fuzz/FuzzX/
## and then run as regression tests under plain go test.
## FUZZ_FLAGS adds go test flags (-parallel 1 on a busy machine).
FUZZ_TIME ?= 5m
FUZZ_FLAGS ?=
fuzz:
	@set -e; for file in $$(grep -rl --include='*_test.go' '^func Fuzz' internal pkg | sort); do \
		for target in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$file); do \
			echo "== $$target ($$(dirname $$file)), $(FUZZ_TIME)"; \
			$(GO) test -run '^$$' -fuzz "^$$target\$$" -fuzztime $(FUZZ_TIME) $(FUZZ_FLAGS) ./$$(dirname $$file); \
		done; \
	done

## cluster-bins: every upstream binary (control plane, helm v4 and v3) at
## once; the targets and scripts that run one build it when they first need
## it (hack/build-cluster-bins.sh NAME...).
cluster-bins:
	hack/build-cluster-bins.sh

helm4-bin:
	hack/build-cluster-bins.sh helm-v4

cluster-up:
	hack/local-cluster.sh up

## pg-up, pg-down: a throwaway PostgreSQL on loopback for HELM_DRIVER=sql
## (hack/local-postgres.sh; `hack/local-postgres.sh env` prints the exports).
pg-up:
	hack/local-postgres.sh up

pg-down:
	hack/local-postgres.sh down

cluster-down:
	hack/local-cluster.sh down

## demo: builds what it needs (this tool, stock helm v4, and the local
## control plane unless $$KUBECONFIG reaches a cluster), saying first how
## long a cold build takes; hack/coldstart.sh times it from cold caches.
demo:
	hack/demo.sh

## bench: figures for docs/benchmarks.md, on the local control plane.
## BENCH_BASELINE=path/to/older/helm-autorecover adds its rows.
## The side-by-side suite (hack/benchsuite, issue 13) writes its section of
## docs/benchmarks.md and docs/bench/; BENCH_SUITE_FLAGS='--scenarios=handoff'
## runs one scenario (see go run ./hack/benchsuite --help); `go run
## ./hack/benchsuite --replot` draws the plots again from docs/bench/*.csv.
BENCH_SUITE_FLAGS ?=
bench: build cluster-up helm4-bin
	KUBECONFIG=$(LOCAL_CLUSTER_DIR)/kubeconfig $(GO) run ./hack/benchlocks --bin $(BIN) \
		--helm $${HELM4:-$$HOME/.cache/helm-autorecover/bin/helm-v4} $(if $(BENCH_BASELINE),--baseline $(BENCH_BASELINE))
	KUBECONFIG=$(LOCAL_CLUSTER_DIR)/kubeconfig $(GO) run ./hack/benchtraffic --bin $(BIN) \
		--helm $${HELM4:-$$HOME/.cache/helm-autorecover/bin/helm-v4} $(if $(BENCH_BASELINE),--baseline $(BENCH_BASELINE))
	KUBECONFIG=$(LOCAL_CLUSTER_DIR)/kubeconfig $(GO) run ./hack/benchsuite --bin $(BIN) \
		--helm $${HELM4:-$$HOME/.cache/helm-autorecover/bin/helm-v4} $(BENCH_SUITE_FLAGS)

## chaos: the fault-injection suite (issue 14) on the local control plane:
## kills at every step, skewed clocks and servers, failing servers, restarts,
## pauses, contention; writes docs/reliability.md. Not part of make test (a
## smoke subset is: TestChaosSmoke). CHAOS_FLAGS='--scenarios=kill' runs one
## group (see go run ./hack/benchsuite --help). The restart group stops and
## starts the cluster's etcd and kube-apiserver: where others share the
## cluster, give it one of its own (LOCAL_CLUSTER_DIR=/tmp/chaos-cluster make
## chaos). A group that fails is written as such and the next ones still run;
## the exit status is non-zero after a failed group or a violation.
CHAOS_FLAGS ?=
chaos: build-chaos cluster-up helm4-bin
	KUBECONFIG=$(LOCAL_CLUSTER_DIR)/kubeconfig $(GO) run ./hack/benchsuite --suite chaos \
		--helm $${HELM4:-$$HOME/.cache/helm-autorecover/bin/helm-v4} $(CHAOS_FLAGS)

## bench-controller: the controller at scale (issue 12 item 7): 10,000 releases
## in 100 namespaces, 100 left stuck under dead holders' locks; time to sync,
## memory, expiry-to-recovery delay, requests; writes its section of
## docs/benchmarks.md (between the benchcontroller markers).
## BENCH_CONTROLLER_FLAGS=--steady=1m shortens the steady state; --doc= writes
## no document, --doc=PATH another one (for a trial at a smaller scale).
bench-controller: build cluster-up
	KUBECONFIG=$(LOCAL_CLUSTER_DIR)/kubeconfig $(GO) run ./hack/benchcontroller --bin $(BIN) $(BENCH_CONTROLLER_FLAGS)

## chart-lint: stock helm v4 lints the controller's chart (test/e2e TestChart* test it fully).
chart-lint: helm4-bin
	$${HELM4:-$${HELM_AUTORECOVER_CACHE:-$${XDG_CACHE_HOME:-$$HOME/.cache}/helm-autorecover}/bin/helm-v4} lint --strict charts/helm-autorecover

fmt:
	gofmt -w $$(git ls-files '*.go')

vet:
	$(GO) vet ./...

## tools: the pinned developer tools (hack/tools), and promtool (hack/promtool,
## for the chart's alert tests; built once into the binary cache).
tools: promtool
	hack/tools.sh

## promtool: Prometheus' promtool from the module pinned in hack/promtool,
## into the binary cache (test/e2e/alerts_test.go builds it when missing).
promtool:
	hack/promtool.sh >/dev/null

lint: tools
	test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet ./...
	$(GOLANGCI_LINT) run --allow-parallel-runners ./...
	# hack/image is a module of its own (go-containerregistry stays out of go.mod).
	cd hack/image && $(GO) vet ./... && $(GOLANGCI_LINT) run --allow-parallel-runners --config ../../.golangci.yml ./...

clean:
	rm -rf bin dist
