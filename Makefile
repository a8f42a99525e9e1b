# Generated code (deepcopy, CRDs) is committed; `make verify` fails CI when it is stale.
CONTROLLER_GEN = go run sigs.k8s.io/controller-tools/cmd/controller-gen@v0.23.0

.PHONY: help
help: ## List targets.
	@grep -E "^[a-z-]+:.*## " $(MAKEFILE_LIST) | sed "s/:.*## /\t/"

.PHONY: generate
generate: ## Regenerate deepcopy functions and CRD manifests from api/.
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths=./api/...
	@# Start from an empty directory so a removed kind does not leave its CRD behind.
	rm -f config/crd/bases/*.yaml
	$(CONTROLLER_GEN) crd paths=./api/... output:crd:artifacts:config=config/crd/bases
	@# The VolumeSnapshot kinds are upstream's own CRDs (snapshot.storage.k8s.io is a
	@# Kubernetes API group), taken from the external-snapshotter client module go.mod pins.
	@# go list -m names a module's directory only once it is in the module cache, which on a
	@# fresh machine it is not yet (nothing in ./api imports it): download it first.
	go mod download github.com/kubernetes-csi/external-snapshotter/client/v8
	install -m 0644 $$(go list -m -f '{{.Dir}}' github.com/kubernetes-csi/external-snapshotter/client/v8)/config/crd/snapshot.storage.k8s.io_*.yaml config/crd/bases/
	@# One least-privilege role per service, from the +kubebuilder:rbac markers in its package.
	$(CONTROLLER_GEN) rbac:roleName=crdipc-books paths=./internal/books/... output:rbac:artifacts:config=config/rbac/books
	$(CONTROLLER_GEN) rbac:roleName=crdipc-bitcoin-operator paths=./internal/bitcoin/... output:rbac:artifacts:config=config/rbac/bitcoin-operator
	$(CONTROLLER_GEN) rbac:roleName=crdipc-storage-operator paths=./internal/storage/operator/... output:rbac:artifacts:config=config/rbac/storage-operator
	$(CONTROLLER_GEN) rbac:roleName=crdipc-pool-agent paths=./internal/storage/agent/... output:rbac:artifacts:config=config/rbac/pool-agent
	$(CONTROLLER_GEN) rbac:roleName=crdipc-csi-driver paths=./internal/csi/driver/... output:rbac:artifacts:config=config/rbac/csi-driver
	$(CONTROLLER_GEN) rbac:roleName=crdipc-csi-node paths=./internal/csi/nodeservice/... output:rbac:artifacts:config=config/rbac/csi-node
	$(CONTROLLER_GEN) rbac:roleName=crdipc-csi-sidecar paths=./internal/csi/sidecar/... output:rbac:artifacts:config=config/rbac/csi-sidecar
	$(CONTROLLER_GEN) rbac:roleName=crdipc-snapshot-controller paths=./internal/csi/snapshotcontroller/... output:rbac:artifacts:config=config/rbac/snapshot-controller
	$(CONTROLLER_GEN) rbac:roleName=crdipc-webhook-listener paths=./internal/scm/webhook/... output:rbac:artifacts:config=config/rbac/webhook-listener
	$(CONTROLLER_GEN) rbac:roleName=crdipc-metrics-agent paths=./internal/scm/metricsagent/... output:rbac:artifacts:config=config/rbac/metrics-agent
	@# The simulated nodes' watch and pool agent supervisor (up only: each node writes as
	@# system:node:<name>) and up's console.
	$(CONTROLLER_GEN) rbac:roleName=crdipc-nodes paths="./internal/simnode/...;./internal/podsim/...;./internal/services" output:rbac:artifacts:config=config/rbac/nodes
	$(CONTROLLER_GEN) rbac:roleName=crdipc-console paths=./internal/console/... output:rbac:artifacts:config=config/rbac/console

.PHONY: verify
verify: generate ## Fail if generated files are stale or untracked, code is unformatted, or vet complains.
	@if ! git diff --exit-code --stat -- api config; then \
		echo "verify: generated files in api/ or config/ are stale: run 'make generate' and commit the result" >&2; \
		exit 1; \
	fi
	@untracked="$$(git status --porcelain --untracked-files=all -- api config)"; \
	if [ -n "$$untracked" ]; then \
		echo "$$untracked" >&2; \
		echo "verify: uncommitted files in api/ or config/ (new generated files?): run 'make generate' and commit the result" >&2; \
		exit 1; \
	fi
	@unformatted="$$(gofmt -l .)"; \
	if [ -n "$$unformatted" ]; then \
		echo "$$unformatted" >&2; \
		echo "verify: files above are not gofmt-formatted: run 'gofmt -w' on them" >&2; \
		exit 1; \
	fi
	go vet ./...

.PHONY: build
build: ## Build bin/crdipc.
	go build -o bin/crdipc ./cmd/crdipc

# The crdipc version, from the file VERSION: the image tag, and config/default's newTag.
VERSION := $(shell cat VERSION)
IMAGE ?= crdipc/crdipc:$(VERSION)
.PHONY: image
image: ## Build the image crdipc/crdipc:<contents of VERSION> into bin/crdipc-image.tar (docker-archive; its binary, built as make build builds it, as bin/crdipc) without Docker or a registry: root, apt, umoci, skopeo (hack/image.sh; IMAGE=name:tag overrides). Load it with ctr -n k8s.io images import bin/crdipc-image.tar.
	IMAGE="$(IMAGE)" hack/image.sh

.PHONY: image-docker
image-docker: ## docker build the same image from the Dockerfile (IMAGE=name:tag overrides). Needs a Docker engine with BuildKit, which CI and the dev machines lack.
	docker build --build-arg VERSION=$(VERSION) -t $(IMAGE) .

.PHONY: up
up: ## Run the control plane and every service (see `crdipc up --help`).
	go run ./cmd/crdipc up $(ARGS)

.PHONY: test-deps
test-deps: ## Install what the tests use if missing: Debian's prometheus and e2fsprogs, btcd (go install).
	hack/test-deps.sh

.PHONY: test
test: test-deps ## Run every test; integration tests start a real embedded API server per package.
	go test -count=1 -timeout 60m ./...

# The race detector over up, its services and the storage stack: the unit and integration
# tests of the CSI and storage packages, internal/services and internal/testenv; test/tracing,
# which runs the services (the CSI sidecar among them) in its test process against the
# embedded API server; and test/e2e's tests of up and of its storage, with up itself built
# with -race (upproc.GoBuildFlags): they fail on any race up reports. A race is a bug to fix,
# never to suppress. test-race-unit and test-race-e2e are its two halves.
RACE_PKGS ?= ./internal/csi/... ./internal/storage/... ./internal/services/... ./internal/testenv/... ./test/tracing/...
RACE_E2E ?= ^(TestUp|TestREADME|TestUpServicesBooks|TestReplicatedVolume|TestBackupToS3|TestSanityDefaults)$$
.PHONY: test-race test-race-unit test-race-e2e
test-race: test-race-unit test-race-e2e ## Run the storage stack's tests, up's and its services' under the race detector (go test -race).
test-race-unit: test-deps ## The first half of test-race: the packages' tests.
	@# -short: the backup model test runs 1,000 of its 10,000 interleavings (make test runs
	@# them all; its scheduler is one step at a time, so -race adds nothing per run).
	go test -race -short -count=1 -timeout 60m $(RACE_PKGS)
test-race-e2e: test-deps ## The second half of test-race: test/e2e's tests of up and its storage, up built with -race.
	go test -race -count=1 -timeout 60m -run '$(RACE_E2E)' ./test/e2e/

# Kubernetes' own storage e2e suite (e2e.test, External.Storage) against crdipc on three real
# nodes, test/conformance/testdriver.yaml declaring what the driver can do (docs/csi.md,
# "Conformance"). CONFORMANCE_SETS picks sets (parallel serial features: all by default);
# CONFORMANCE_SUBSET=test/conformance/ci.yaml runs CI's subset (those specs by name) instead.
CONFORMANCE_SETS ?=
CONFORMANCE_SUBSET ?=
CONFORMANCE_REPORT ?= $(CURDIR)/conformance-report
.PHONY: conformance
conformance: image ## Run Kubernetes' storage e2e suite against crdipc on three real nodes (root; ~40 min, ~55 min with a cold build cache; reports in conformance-report/).
	CONFORMANCE_SUBSET="$(CONFORMANCE_SUBSET)" hack/conformance.sh all --report-dir $(CONFORMANCE_REPORT) $(CONFORMANCE_SETS)

.PHONY: bench
bench: ## Measure the API server floor of this machine.
	go run ./cmd/crdipc bench floor

.PHONY: bench-all
bench-all: ## Run every bench (~30 min, several GiB of RAM at 100k Books) into docs/performance/results.json, then draw it (make performance).
	mkdir -p docs/performance
	go run ./cmd/crdipc bench all --json docs/performance/results.json
	$(MAKE) performance

.PHONY: performance
performance: ## Draw docs/performance/results.json (from make bench-all) as the PNGs docs/performance.md shows.
	go run ./cmd/crdipc bench plot --in docs/performance/results.json --out docs/performance

CHAOS_TRIALS ?= 200
.PHONY: chaos
chaos: ## Kill the storage operator or an agent at random writes, CHAOS_TRIALS times (STORAGE_KILL_SEED=n reproduces a run).
	STORAGE_KILL_TRIALS=$(CHAOS_TRIALS) go test -count=1 -timeout 60m -run TestKillAnyComponentAtAnyWrite -v ./internal/storage/operator
