# caa — build, test and measure. `make help` lists the targets.

GO          ?= go
VERSION     ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS     := -s -w -X main.version=$(VERSION)
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
BENCH_COUNT ?= 5
BENCH_OUT   ?= .cache/bench

.PHONY: proto help build demo test test-unit test-integration e2e-binaries lint fmt bench bench-quick fuzz clean image static

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

# The container's binary. The Dockerfile runs this very target, so the image
# and a local `make static` cannot build caa in two different ways.
STATIC_OUT ?= bin/caa-static
# One image per cloud is what the overlays deploy: `make image CLOUDS=aws`
# tags $(IMAGE_REPO):$(VERSION)-aws, and deploy/overlays/aws asks for that
# -aws tag (its memory request is measured for the EC2-only build). Without
# CLOUDS the image holds every cloud and keeps the bare tag.
IMAGE_REPO   ?= caa
IMAGE_SUFFIX := $(if $(CLOUDS),-$(subst $(comma),-,$(CLOUDS)))
IMAGE        ?= $(IMAGE_REPO):$(VERSION)$(IMAGE_SUFFIX)
# A misspelt cloud would select no build tag, which silently builds every
# cloud; refuse it instead.
check-clouds = $(if $(filter-out aws azure ibmcloud,$(subst $(comma), ,$(CLOUDS))),$(error CLOUDS=$(CLOUDS): each name must be aws, azure or ibmcloud))
# An IMAGE given by hand must still say which build it holds, in the tag's
# suffix: the overlays and deploy/README.md go by it.
check-image-tag = $(if $(CLOUDS),$(if $(filter %$(IMAGE_SUFFIX),$(IMAGE)),,$(error IMAGE=$(IMAGE) holds the CLOUDS=$(CLOUDS) build, so its tag must end in $(IMAGE_SUFFIX))),$(if $(filter %-aws %-azure %-ibmcloud,$(IMAGE)),$(error IMAGE=$(IMAGE) has a one-cloud tag, but without CLOUDS the image holds every cloud)))

static: ## the image's binary: static (CGO_ENABLED=0), -trimpath, into $(STATIC_OUT); GOOS/GOARCH cross-build; CLOUDS=aws for one provider
	$(check-clouds)CGO_ENABLED=0 $(GO) build $(GOTAGS) -trimpath -buildvcs=false -ldflags '$(LDFLAGS)' -o $(STATIC_OUT) ./cmd/caa

image: ## container image with `docker build`: CLOUDS=aws tags $(IMAGE_REPO):<version>-aws, the image deploy/overlays/aws deploys (needs a Docker daemon; this machine has none)
	$(check-clouds)$(check-image-tag)docker build --build-arg VERSION=$(VERSION) --build-arg CLOUDS=$(CLOUDS) -t $(IMAGE) .

demo: ## the guided demo: etcd, kube-apiserver, a fake cloud (CLOUD=aws|azure|ibmcloud) and caa through a restart
	$(GO) run ./test/e2e/cmd/demo

test: lint test-integration ## everything CI runs: lint, then every test (unit, integration, e2e, fuzz seeds) under the race detector

test-unit: ## fast tests only: no e2e packages, and -short skips the crash loop and the built-binary tests
	$(GO) test -short -count=1 $$($(GO) list ./... | grep -v /test/e2e)

test-integration: e2e-binaries ## every test, with the race detector
	$(GO) test -race -count=1 -timeout 40m ./...

e2e-binaries: ## build (or find cached) etcd and kube-apiserver for the e2e tests; cold: minutes
	$(GO) run ./test/e2e/cmd/e2e-binaries

lint: ## gofmt check, go vet, staticcheck (pinned)
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	for c in aws azure ibmcloud; do $(GO) vet -tags caa_$$c ./cmd/caa || exit 1; done
	$(GO) run $(STATICCHECK) ./...

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
