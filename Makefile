# caa — build, test and measure. `make help` lists the targets.

GO          ?= go
# bash for pipefail: `make test` pipes go test -json through testtimes.
SHELL       := /bin/bash
VERSION     ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS     := -s -w -X main.version=$(VERSION)
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
BENCH_COUNT ?= 5
BENCH_OUT   ?= .cache/bench

.PHONY: proto help build demo demo-kata test test-unit test-integration test-e2e test-main test-chart test-times e2e-binaries node-binaries upstream-binaries test-node test-upstream-podvm lint fmt bench bench-quick bench-s12 fuzz clean image static

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

# CLOUDS picks the providers built in (comma-separated: aws, azure,
# ibmcloud); empty builds all three. One cloud makes a binary a third the
# size that needs far less memory (README, Benchmarks S4).
CLOUDS  ?=
comma   := ,
GOTAGS  := $(if $(CLOUDS),-tags '$(subst $(comma),$(comma)caa_,caa_$(CLOUDS))')

build: ## build bin/caa (CLOUDS=aws for one provider only)
	CGO_ENABLED=0 $(GO) build $(GOTAGS) -trimpath -ldflags '$(LDFLAGS)' -o bin/caa ./cmd/caa

# The image's binary: `make image` builds it with this very target, so the
# image and a local `make static` cannot build caa in two different ways.
STATIC_OUT ?= bin/caa-static
# A misspelt cloud would select no build tag, which silently builds every
# cloud; refuse it instead.
check-clouds = $(if $(filter-out aws azure ibmcloud,$(subst $(comma), ,$(CLOUDS))),$(error CLOUDS=$(CLOUDS): each name must be aws, azure or ibmcloud))

static: ## the image's binary: static (CGO_ENABLED=0), -trimpath, into $(STATIC_OUT); GOOS/GOARCH cross-build; CLOUDS=aws for one provider
	$(check-clouds)CGO_ENABLED=0 $(GO) build $(GOTAGS) -trimpath -buildvcs=false -ldflags '$(LDFLAGS)' -o $(STATIC_OUT) ./cmd/caa

# One image per cloud, each holding that cloud's build only, which is what
# the overlays and the chart deploy (their memory is measured for it):
# $(IMAGE_DIR)/caa-<version>-<cloud>.tar, tagged $(IMAGE_REPO):<version>-<cloud>.
# Written by internal/imagebuild with go-containerregistry: no container
# engine, no base image to pull (docs/design.md, The image). GOARCH=arm64
# builds the arm64 image: the binary is cross-built, the tool runs here.
IMAGE_REPO   ?= caa
IMAGE_DIR    ?= bin/image
IMAGE_SOURCE ?= https://github.com/caa-project/caa
IMAGE_CLOUDS  = $(if $(CLOUDS),$(subst $(comma), ,$(CLOUDS)),aws azure ibmcloud)
REVISION     ?= $(shell git rev-parse HEAD 2>/dev/null)
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)

image: ## OCI image archives, one per cloud, without a container engine: $(IMAGE_DIR)/caa-<version>-<cloud>.tar (CLOUDS=aws for one); docker load -i, podman load -i or skopeo copy oci-archive: them
	$(check-clouds)
	@mkdir -p $(IMAGE_DIR)
	$(foreach c,$(IMAGE_CLOUDS),$(call image-of,$(c)))

# image-of is the two recipe lines that build cloud $(1)'s image; one line
# each, so that `make -n image` (deploy/memory_test.go) prints the tags and
# runs nothing.
define image-of
$(MAKE) --no-print-directory static CLOUDS=$(1) STATIC_OUT=$(IMAGE_DIR)/caa-$(1)
	SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH) GOOS=$$($(GO) env GOHOSTOS) GOARCH=$$($(GO) env GOHOSTARCH) $(GO) run ./internal/imagebuild -binary $(IMAGE_DIR)/caa-$(1) -cloud $(1) -version $(VERSION) -repo $(IMAGE_REPO) -source $(IMAGE_SOURCE) -revision "$(REVISION)" -out $(IMAGE_DIR)/caa-$(VERSION)-$(1).tar
	
endef

demo: ## the guided demo: etcd, kube-apiserver, a fake cloud (CLOUD=aws|azure|ibmcloud) and caa through a restart
	$(GO) run ./test/e2e/cmd/demo

# The kata demo runs the image's binary (make static, the AWS build: the
# demo's cloud is the fake EC2) and a second build of it stamped
# $(VERSION)-next, the version it upgrades to.
DEMO_KATA_BIN ?= bin/demo-kata

demo-kata: ## as root: caa as kata's remote hypervisor with caa relay, 3 peer pods kept through a surge upgrade of caa, then StopVM (README, The kata demo)
	@$(MAKE) --no-print-directory static CLOUDS=aws STATIC_OUT=$(DEMO_KATA_BIN)/caa
	@$(MAKE) --no-print-directory static CLOUDS=aws STATIC_OUT=$(DEMO_KATA_BIN)/caa-next VERSION=$(VERSION)-next
	$(GO) run ./test/e2e/cmd/demo-kata -caa $(DEMO_KATA_BIN)/caa -caa-next $(DEMO_KATA_BIN)/caa-next

# `make test` runs its suites side by side: one make -j over TEST_SUITES,
# each line of output printed whole (-Oline). The machine's 2 cores are
# mostly idle while the e2e packages wait on servers and timers, so lint's
# and the chart module's CPU fits in their waits. A suite is a target that
# fails when its tests fail; one that times itself writes its report to
# $(TIMES_OUT)/<suite>.md, which `make test-times` prints. More suites join
# with TEST_SUITES += <target> (here or on the command line): the real-node
# tests (test-node) and upstream's pod VM programs (test-upstream-podvm).
# A package that a suite of its own runs goes into OWN_SUITE_PKGS so that
# test-main leaves it out.
TEST_SUITES    ?= lint test-e2e test-main test-chart test-node test-upstream-podvm
OWN_SUITE_PKGS ?= github.com/caa-project/caa/test/e2e/realnode

test: ## everything CI runs, side by side: lint, every test (unit, integration, e2e, fuzz seeds) under the race detector, the chart module's; TEST_SUITES lists them
	@mkdir -p $(TIMES_OUT) && rm -f $(TIMES_OUT)/*.md && cat /proc/loadavg > $(TIMES_OUT)/load-before
	@echo "make test: $(TEST_SUITES), side by side; load average before: $$(cat $(TIMES_OUT)/load-before)"
	@start=$$(date +%s); $(MAKE) --no-print-directory -j$(words $(TEST_SUITES)) -Oline $(TEST_SUITES); rc=$$?; \
		echo "make test: $(TEST_SUITES) took $$(( $$(date +%s) - start ))s, exit $$rc; load average after: $$(cat /proc/loadavg)" | tee $(TIMES_OUT)/total; exit $$rc

# The Helm chart's tests are a module of their own (deploy/chart/go.mod:
# Helm's SDK stays out of caa's go.mod; docs/design.md, The Helm chart).
CHART_MOD := deploy/chart

test-unit: ## fast tests only: no e2e packages, and -short skips the crash loop and the built-binary tests
	$(GO) test -short -count=1 $$($(GO) list ./... | grep -v /test/e2e)
	cd $(CHART_MOD) && $(GO) test -short -count=1 ./...

# Each run's per-package and slowest-test times land in $(TIMES_OUT)
# (internal/testtimes; docs/test-times.md keeps a dated copy).
TIMES_OUT ?= .cache/test-times

test-integration: ## every test with the race detector, without lint: the test suites of TEST_SUITES side by side
	@mkdir -p $(TIMES_OUT) && cat /proc/loadavg > $(TIMES_OUT)/load-before
	$(MAKE) --no-print-directory -j -Oline $(filter-out lint,$(TEST_SUITES))

# testtimes reads go test -json; every suite that times itself pipes
# through it (TESTTIMES name.md: the pipe's command for that report).
$(TIMES_OUT)/testtimes: $(wildcard internal/testtimes/*.go)
	@mkdir -p $(TIMES_OUT) && $(GO) build -o $@ ./internal/testtimes
TESTTIMES = $(CURDIR)/$(TIMES_OUT)/testtimes -report $(CURDIR)/$(TIMES_OUT)/$(1) -load-before $(CURDIR)/$(TIMES_OUT)/load-before

# test/e2e is a suite of its own: the longest package, it starts at once
# rather than after the packages go test would run before it, and inside
# it four tests at a time by default (its e2eParallel), as they wait far
# more than they compute.
E2E_PKG := github.com/caa-project/caa/test/e2e

test-e2e: e2e-binaries $(TIMES_OUT)/testtimes ## the e2e package under the race detector; report $(TIMES_OUT)/e2e.md
	@test -f $(TIMES_OUT)/load-before || cat /proc/loadavg > $(TIMES_OUT)/load-before
	set -o pipefail; $(GO) test -race -count=1 -timeout 40m -json ./test/e2e | $(call TESTTIMES,e2e.md)

# The rest of the main module: every package but test/e2e and those in
# OWN_SUITE_PKGS, two at a time (go test's -p is GOMAXPROCS), the slowest
# (MAIN_FIRST) first so that none of them starts last.
MAIN_FIRST := ./test/e2e/rollout ./deploy ./internal/imagebuild ./cmd/caa

test-main: e2e-binaries $(TIMES_OUT)/testtimes ## the main module's other tests under the race detector; report $(TIMES_OUT)/main.md
	@test -f $(TIMES_OUT)/load-before || cat /proc/loadavg > $(TIMES_OUT)/load-before
	set -o pipefail; first=$$($(GO) list $(MAIN_FIRST)); \
		rest=$$($(GO) list ./... | grep -vxF -e $(E2E_PKG) $$(printf -- '-e %s ' $$first) $(foreach p,$(OWN_SUITE_PKGS),-e '$(p)')); \
		$(GO) test -race -count=1 -timeout 40m -json $$first $$rest | $(call TESTTIMES,main.md)

test-chart: e2e-binaries $(TIMES_OUT)/testtimes ## the Helm chart module's tests under the race detector; report $(TIMES_OUT)/chart.md
	@test -f $(TIMES_OUT)/load-before || cat /proc/loadavg > $(TIMES_OUT)/load-before
	set -o pipefail; cd $(CHART_MOD) && $(GO) test -race -count=1 -timeout 20m -json ./... | $(call TESTTIMES,chart.md)

test-times: ## print where the last `make test` spent its time (each suite's packages and 30 slowest tests, the total)
	@cat $(TIMES_OUT)/*.md; cat $(TIMES_OUT)/total 2>/dev/null || true

.PHONY: test-upstream-podvm upstream-binaries
test-upstream-podvm: e2e-binaries $(TIMES_OUT)/testtimes ## the remote hypervisor e2e with upstream's real process-user-data and agent-protocol-forwarder in the pod VMs, built from UPSTREAM_SRC (or taken from CAA_UPSTREAM_PODVM_BIN); as root, iptables installed
	@test -f $(TIMES_OUT)/load-before || cat /proc/loadavg > $(TIMES_OUT)/load-before
	@bin="$$CAA_UPSTREAM_PODVM_BIN"; if [ -z "$$bin" ]; then src="$${UPSTREAM_SRC:-$$(sh hack/clone-upstream.sh)}" || exit 2; \
		export UPSTREAM_SRC="$$src"; bin=$$($(GO) run ./test/e2e/cmd/upstream-binaries -dir podvm) || exit 2; fi; \
	set -o pipefail; CAA_UPSTREAM_PODVM_BIN="$$bin" $(GO) test -count=1 -timeout 30m -json -run '^(TestHypervisor|TestNodeAdvertisesPeerPodCapacity)' ./test/e2e | $(call TESTTIMES,upstream-podvm.md)

upstream-binaries: ## build (or find cached) upstream's programs from UPSTREAM_SRC (the pinned archives or clones): the pod VM's, cloud-api-adaptor, kata's shim and config, the test kata agent
	$(GO) run ./test/e2e/cmd/upstream-binaries

e2e-binaries: ## build (or find cached) etcd and kube-apiserver for the e2e tests; cold: minutes
	$(GO) run ./test/e2e/cmd/e2e-binaries

node-binaries: ## build (or find cached) a real node's programs: containerd, runc (cgo: gcc, libseccomp-dev), CNI plugins, crictl, the kubelet; cold: minutes
	$(GO) run ./test/e2e/cmd/node-binaries

# UPSTREAM_SRC: a directory holding upstream's pinned sources, either their
# archives (cloud-api-adaptor-<commit>.tar.gz, kata-containers-4.1.0.tar.gz)
# or clones of the two repositories (README, Tests); unset, the two
# repositories are cloned into ~/.cache/caa-e2e/upstream-src
# (hack/clone-upstream.sh).
test-node: e2e-binaries node-binaries $(TIMES_OUT)/testtimes ## as root: a real node (containerd, kata's shim, runc, CNI, a kubelet) runs peer pods on caa, levels 1 and 2 (test/e2e/realnode); needs UPSTREAM_SRC
	@test -f $(TIMES_OUT)/load-before || cat /proc/loadavg > $(TIMES_OUT)/load-before
	@src="$${UPSTREAM_SRC:-$$(sh hack/clone-upstream.sh)}" || exit 2; export UPSTREAM_SRC="$$src"; \
		$(GO) run ./test/e2e/cmd/upstream-binaries && \
		set -o pipefail && $(GO) test -count=1 -timeout 40m -json ./test/e2e/realnode | $(call TESTTIMES,node.md)

lint: ## gofmt check, go vet, staticcheck (pinned)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	for c in aws azure ibmcloud; do $(GO) vet -tags caa_$$c ./cmd/caa ./internal/clouds || exit 1; done
	$(GO) run $(STATICCHECK) ./...
	cd $(CHART_MOD) && $(GO) vet ./... && $(GO) run $(STATICCHECK) ./...

fmt: ## rewrite files with gofmt
	gofmt -w $$(git ls-files '*.go')

bench: ## benchmarks: Go benchmarks (S3) and the scenarios S1-S11 (S6: a fleet of caa on one account, S6-kata its remote hypervisor rows; S8: the remote hypervisor mode; S9: a rolling update with caa relay; S10: a burst of 100 sandboxes on a node; S11: memory per sandbox; S6-kata and S8-S11 as root) with the real caa; $(BENCH_COUNT) runs each; results in docs/bench and README
	@mkdir -p $(BENCH_OUT)
	@cat /proc/loadavg > $(BENCH_OUT)/load-before
	$(GO) test -run '^$$' -bench . -benchmem -count $(BENCH_COUNT) -timeout 60m ./pkg/... | tee $(BENCH_OUT)/raw.txt
	$(GO) run ./internal/benchreport < $(BENCH_OUT)/raw.txt | tee $(BENCH_OUT)/summary.md
	$(GO) run ./test/bench -count $(BENCH_COUNT) -gobench $(BENCH_OUT)/summary.md -load-before $(BENCH_OUT)/load-before -out docs/bench -readme README.md

bench-quick: ## scenarios only, for development: 1 run each, N up to 1,000, short windows, a fleet of 5 (S6); results in $(BENCH_OUT)/quick
	$(GO) run ./test/bench -quick -out $(BENCH_OUT)/quick

bench-s12: ## S12 only, as root: caa and upstream's cloud-api-adaptor side by side in the rig of S8-S11 (UPSTREAM_SRC: upstream's sources, as for test-upstream-podvm); merged into docs/bench and the README
	$(GO) run ./test/bench -scenarios s12 -merge -count $(BENCH_COUNT) -out docs/bench -readme README.md

fuzz: ## run the ledger decoder fuzzers for FUZZTIME each (default 60s)
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeRecord$$' -fuzztime $${FUZZTIME:-60s} ./pkg/ledger/
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeEvent$$' -fuzztime $${FUZZTIME:-60s} ./pkg/ledger/

proto: ## regenerate pkg/hypervisor/hypervisorpb from its .proto (needs protoc; the output is committed, so builds and CI do not)
	$(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
	$(GO) install github.com/containerd/ttrpc/cmd/protoc-gen-go-ttrpc@v1.2.10
	cd pkg/hypervisor/hypervisorpb && PATH="$$($(GO) env GOPATH)/bin:$$PATH" protoc --proto_path=. \
		--go_out=. --go_opt=paths=source_relative --go-ttrpc_out=. --go-ttrpc_opt=paths=source_relative hypervisor.proto

clean: ## remove build and bench output
	rm -rf bin .cache
