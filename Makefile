# caa — build, test and measure. `make help` lists the targets.

GO          ?= go
# bash for pipefail: `make test` pipes go test -json through testtimes.
SHELL       := /bin/bash
VERSION     ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS     := -s -w -X main.version=$(VERSION)
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
BENCH_COUNT ?= 5
BENCH_OUT   ?= .cache/bench

.PHONY: proto help build demo demo-kata test test-unit test-integration test-times e2e-binaries node-binaries test-node lint fmt bench bench-quick bench-s12 fuzz clean image static

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

test: lint test-integration ## everything CI runs: lint, then every test (unit, integration, e2e, fuzz seeds) under the race detector

# The Helm chart's tests are a module of their own (deploy/chart/go.mod:
# Helm's SDK stays out of caa's go.mod; docs/design.md, The Helm chart).
CHART_MOD := deploy/chart

test-unit: ## fast tests only: no e2e packages, and -short skips the crash loop and the built-binary tests
	$(GO) test -short -count=1 $$($(GO) list ./... | grep -v /test/e2e)
	cd $(CHART_MOD) && $(GO) test -short -count=1 ./...

# Each run's per-package and slowest-test times land in $(TIMES_OUT)
# (internal/testtimes; docs/test-times.md keeps a dated copy).
TIMES_OUT ?= .cache/test-times

test-integration: e2e-binaries ## every test, with the race detector (the chart's module too); where the time went: $(TIMES_OUT)
	@mkdir -p $(TIMES_OUT) && cat /proc/loadavg > $(TIMES_OUT)/load-before
	$(GO) build -o $(TIMES_OUT)/testtimes ./internal/testtimes
	set -o pipefail; $(GO) test -race -count=1 -timeout 40m -json ./... | $(TIMES_OUT)/testtimes -report $(TIMES_OUT)/main.md -load-before $(TIMES_OUT)/load-before
	set -o pipefail; cd $(CHART_MOD) && $(GO) test -race -count=1 -timeout 20m -json ./... | ../../$(TIMES_OUT)/testtimes -report ../../$(TIMES_OUT)/chart.md

test-times: ## print where the last `make test` spent its time (per package, the 30 slowest tests)
	@cat $(TIMES_OUT)/main.md $(TIMES_OUT)/chart.md

.PHONY: test-upstream-podvm upstream-binaries
test-upstream-podvm: e2e-binaries ## the remote hypervisor e2e with upstream's real process-user-data and agent-protocol-forwarder in the pod VMs, built from UPSTREAM_SRC (or taken from CAA_UPSTREAM_PODVM_BIN); as root, iptables installed
	@bin="$$CAA_UPSTREAM_PODVM_BIN"; if [ -z "$$bin" ]; then bin=$$($(GO) run ./test/e2e/cmd/upstream-binaries -dir podvm) || exit 2; fi; \
	set -x; CAA_UPSTREAM_PODVM_BIN="$$bin" $(GO) test -count=1 -timeout 30m -run '^(TestHypervisor|TestNodeAdvertisesPeerPodCapacity)' ./test/e2e

upstream-binaries: ## build (or find cached) upstream's programs from UPSTREAM_SRC (the pinned archives or clones): the pod VM's, cloud-api-adaptor, kata's shim and config, the test kata agent
	$(GO) run ./test/e2e/cmd/upstream-binaries

e2e-binaries: ## build (or find cached) etcd and kube-apiserver for the e2e tests; cold: minutes
	$(GO) run ./test/e2e/cmd/e2e-binaries

node-binaries: ## build (or find cached) a real node's programs: containerd, runc (cgo: gcc, libseccomp-dev), CNI plugins, crictl, the kubelet; cold: minutes
	$(GO) run ./test/e2e/cmd/node-binaries

# UPSTREAM_SRC: a directory holding upstream's pinned sources, either their
# archives (cloud-api-adaptor-<commit>.tar.gz, kata-containers-4.1.0.tar.gz)
# or clones of the two repositories (README, Tests).
test-node: e2e-binaries node-binaries ## as root: a real node (containerd, kata's shim, runc, CNI, a kubelet) runs peer pods on caa, levels 1 and 2 (test/e2e/realnode); needs UPSTREAM_SRC
	@if [ -z "$$UPSTREAM_SRC" ]; then echo "UPSTREAM_SRC is not set: point it at a directory of upstream's pinned sources (archives or clones of cloud-api-adaptor and kata-containers; README, Tests)"; exit 2; fi
	$(GO) test -count=1 -timeout 40m -v ./test/e2e/realnode

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
