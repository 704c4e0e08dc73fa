# Every target works from a fresh clone: tools run with `go run` at pinned versions and
# the control-plane binaries are built from the Go module proxy into a cache outside the
# repository (see test/testbin/build.sh).

SHELL           := bash
.SHELLFLAGS     := -eu -o pipefail -c

GO              ?= go
STATICCHECK     := honnef.co/go/tools/cmd/staticcheck@v0.8.2
CONTROLLER_GEN  := sigs.k8s.io/controller-tools/cmd/controller-gen@v0.23.0
BENCHSTAT       := golang.org/x/perf/cmd/benchstat@v0.0.0-20260908200009-22c9c6c9d4da
TEST_TIMEOUT    ?= 30m
# Each fuzz target runs a number of executions, not a duration: a duration races Go 1.26's
# fuzzing coordinator at its deadline and fails a run that found nothing (go.dev/issue/75804,
# fixed in Go 1.27). The counts are a few seconds of each target on two cores.
FUZZ_LOAD       ?= 10000x
FUZZ_LOAD_TREE  ?= 4000x
FUZZ_TOKEN      ?= 20000x
FUZZ_RECEIVE    ?= 100000x
# The fuzzer minimizes every input that finds new coverage for up to a minute by default,
# counting no executions meanwhile: in a run of seconds it would do little else.
FUZZ_MINIMIZE   ?= 1s
BENCH_COUNT     ?= 6

# KUBEBUILDER_ASSETS points envtest at the cached kube-apiserver and etcd, FLOTILLA_KUEUE the
# tests' Kueue managers at the cached kueue binary (test/kueuetest), FLOTILLA_JOBSET the JobSet
# managers behind the JobSet chart at the cached jobset binary (test/componenttest), and
# FLOTILLA_HELM, FLOTILLA_KUBECTL and FLOTILLA_AGE_KEYGEN the commands the README's install
# path runs (test/install); building them on a cold machine takes minutes, which is why it
# happens before go test starts its timeout.
TESTBIN_ENV = KUBEBUILDER_ASSETS="$$(bash test/testbin/build.sh | tail -n 1)" \
	FLOTILLA_KUEUE="$$(bash test/testbin/kueue.sh | tail -n 1)" \
	FLOTILLA_JOBSET="$$(bash test/testbin/jobset.sh | tail -n 1)" \
	FLOTILLA_HELM="$$(bash test/testbin/helm.sh | tail -n 1)" \
	FLOTILLA_KUBECTL="$$(bash test/testbin/kubectl.sh | tail -n 1)" \
	FLOTILLA_AGE_KEYGEN="$$(bash test/testbin/age-keygen.sh | tail -n 1)"

.PHONY: all build images test unit fuzz lint bench soak testbin generate clean demo

all: build

# The four commands, not ./cmd/...: cmd/internal/imagebuild is a build tool, not a product.
build:
	$(GO) build -o bin/ ./cmd/flotilla ./cmd/flotilla-hub ./cmd/flotilla-agent ./cmd/flotilla-components

# The container images of the hub and the agent, built without a container engine or a base
# image (cmd/internal/imagebuild says what they hold): bin/images/flotilla-hub-<appVersion>.tar
# and bin/images/flotilla-agent-<appVersion>.tar, each an OCI image layout in a tar file with
# an image index over IMAGE_PLATFORMS, tagged with the charts' appVersion. The same sources
# give the same digests; SOURCE_DATE_EPOCH sets the creation time (else the commit's).
# Push with the tool of your choice, for example:
#   skopeo copy --all oci-archive:bin/images/flotilla-hub-0.1.0.tar docker://REGISTRY/flotilla-hub:0.1.0
#   mkdir bin/images/hub && tar -xf bin/images/flotilla-hub-0.1.0.tar -C bin/images/hub
#   crane push bin/images/hub REGISTRY/flotilla-hub:0.1.0
#   docker load -i bin/images/flotilla-hub-0.1.0.tar   # Docker with its containerd image store
IMAGE_PLATFORMS ?= linux/amd64,linux/arm64

images:
	$(GO) run ./cmd/internal/imagebuild images --go $(GO) --out bin/images --platforms $(IMAGE_PLATFORMS)

test: testbin
	$(TESTBIN_ENV) $(GO) test -race -timeout $(TEST_TIMEOUT) ./...
	$(MAKE) fuzz

# The soak make test runs at 300 pushes through the notes backend, here at 5,000 through
# each of the four status backends, without the race detector: the hub's resident memory,
# live heap and goroutines every 500 pushes, in bin/soak.txt (the whole log in bin/soak.log).
SOAK_PUSHES ?= 5000
SOAK_BACKENDS ?= all
soak: testbin
	@mkdir -p bin
	$(TESTBIN_ENV) FLOTILLA_SOAK_PUSHES=$(SOAK_PUSHES) FLOTILLA_SOAK_BACKENDS=$(SOAK_BACKENDS) \
		$(GO) test -run '^TestSoakPushesLeaveTheHubFlat$$' -v -count=1 -timeout 6h ./test/e2e/ 2>&1 \
		| tee bin/soak.log | grep --line-buffered -E 'soak_test.go|^(--- |ok|FAIL|panic)' | tee bin/soak.txt

fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzLoad$$' -fuzztime $(FUZZ_LOAD) -fuzzminimizetime $(FUZZ_MINIMIZE) ./reconciler/fleet/
	$(GO) test -run '^$$' -fuzz '^FuzzLoadTree$$' -fuzztime $(FUZZ_LOAD_TREE) -fuzzminimizetime $(FUZZ_MINIMIZE) ./reconciler/fleet/
	$(GO) test -run '^$$' -fuzz '^FuzzTokenHash$$' -fuzztime $(FUZZ_TOKEN) -fuzzminimizetime $(FUZZ_MINIMIZE) ./secrets/
	$(GO) test -run '^$$' -fuzz '^FuzzReceive$$' -fuzztime $(FUZZ_RECEIVE) -fuzzminimizetime $(FUZZ_MINIMIZE) ./agent/protocol/

lint:
	@unformatted="$$(gofmt -l .)"; if [ -n "$$unformatted" ]; then echo "not gofmt'ed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

bench: testbin
	@mkdir -p bin
	$(GO) test -run '^$$' -bench . -benchmem -count $(BENCH_COUNT) ./reconciler/fleet/ ./secrets/ ./gitsource/ | tee bin/bench.txt
	# The render's goals are for one core: with a second, the collector would take its
	# time there.
	$(GO) test -run '^$$' -bench . -benchmem -cpu 1 -count $(BENCH_COUNT) ./reconciler/render/ | tee -a bin/bench.txt
	# Thousands of agents on one hub: one run, it sets up a fleet's worth of WorkerClusters.
	$(TESTBIN_ENV) $(GO) test -run '^$$' -bench . -benchtime 3x ./test/e2e/ | tee -a bin/bench.txt
	# Dispatch: the watches of idle workers through the proxy, submit-to-worker latency and
	# the proxy's overhead, with the real Kueue managers; each sets up its own world once.
	$(TESTBIN_ENV) $(GO) test -run '^$$' -bench 'IdleWorker|HubMemory' -benchtime 1x ./reconciler/tunnel/ | tee -a bin/bench.txt
	$(TESTBIN_ENV) $(GO) test -run '^$$' -bench . -benchtime 1x -timeout 20m ./test/dispatch/ | tee -a bin/bench.txt
	# The hub at 1, 1,000 and 10,000 clusters: push to success side by side, a fleet-wide
	# change and a cold start. One fleet of each size, set up once (minutes at 10,000).
	$(TESTBIN_ENV) $(GO) test -run '^$$' -bench Hub -benchtime 1x -timeout 3h ./test/scale/ | tee -a bin/bench.txt
	$(GO) run $(BENCHSTAT) bin/bench.txt

testbin:
	@bash test/testbin/build.sh >/dev/null
	@bash test/testbin/kueue.sh >/dev/null
	@bash test/testbin/jobset.sh >/dev/null
	@bash test/testbin/helm.sh >/dev/null
	@bash test/testbin/kubectl.sh >/dev/null
	@bash test/testbin/age-keygen.sh >/dev/null

# The whole flow on this machine: three control planes, a git server, the hub and two
# agents, two clusters enrolled through merges and watched until green (see test/demo).
# FLOTILLA_DEMO_CI=1 exits once they are green. go -C with no package argument, because
# only then does go test hand the test its own stdout: a terminal gets the live table.
demo: testbin
	$(TESTBIN_ENV) $(GO) -C test/demo test -tags demo -run '^TestDemo$$' -v -count=1 -timeout 0

# The Kueue and JobSet charts the agent installs, packaged from the Go modules go.mod
# names, with their licenses. tar and gzip are told to leave out times and owners, so the
# same module always packs to the same bytes.
COMPONENT_CHARTS := agent/components/charts

generate:
	$(GO) run $(CONTROLLER_GEN) object paths=./reconciler/api/... \
		crd:crdVersions=v1 output:crd:artifacts:config=charts/flotilla-hub/crds
	rm -f $(COMPONENT_CHARTS)/*.tgz $(COMPONENT_CHARTS)/*.LICENSE
	set -e; for m in kueue jobset; do \
		dir=$$($(GO) list -m -f '{{.Dir}}' sigs.k8s.io/$$m); \
		ver=$$($(GO) list -m -f '{{.Version}}' sigs.k8s.io/$$m); \
		tar -C $$dir/charts --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --mode=u+rw,go+r \
			-cf - $$m | gzip -n -9 > $(COMPONENT_CHARTS)/$$m-$$ver.tgz; \
		cp $$dir/LICENSE $(COMPONENT_CHARTS)/$$m.LICENSE; chmod 0644 $(COMPONENT_CHARTS)/$$m.LICENSE; \
	done

clean:
	rm -rf bin/
