# amqp091-drainer: every target vendors the patched upstream tree first.
# The two commands the README promises are `make bench` and `make test`.

GO ?= go
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
ACTIONLINT  := github.com/rhysd/actionlint/cmd/actionlint@v1.7.12

.PHONY: vendor test bench bench-full ab bench-smoke lint upstream-tests upstream-tests-pristine thirdparty actionlint modfiles reliability soak cluster chaos rebase canary drift

## vendor: fetch the pinned amqp091-go, verify it, apply patches and overlay (a no-op when up to date)
vendor:
	GOWORK=off $(GO) run ./internal/bootstrap vendor

## test: gofmt, go vet, staticcheck, go test -race ./..., upstream's suite in every mode, the reliability suite short
test: vendor
	scripts/test

## reliability: the full reliability suite: fault matrix, broker faults, no loss, 5-minute soak, 10 minutes per fuzz target
reliability: vendor
	scripts/reliability full

## soak: the 5-minute soak alone: heap and goroutine table over time, no confirmed message lost
soak: vendor
	AMQP091_RELIABILITY=full $(GO) test -race -count=1 -v -timeout 20m -run TestSoak ./reliability/soak

## cluster: the cluster suites (internal/cluster, internal/nemesis: each nemesis fault alone, reliability/cluster: every fault 3 times in every mode) on a three-node RabbitMQ cluster in network namespaces; as root with RabbitMQ installed, else one "skipped:" line
cluster:
	@scripts/cluster-tests full

## chaos: the nemesis on a three-node cluster: per seed, a randomized fault schedule against a workload per read mode at once, then the checker
## (DURATION=10m, SEED=1 or SEED=1,2,3, MODES=drainer,legacy-autodrain,upstream); report in .cache/chaos/REPORT.md; exits 1 on a loss, a leak or a workload that never confirms again
DURATION ?= 10m
SEED ?= 1
MODES ?= drainer,legacy-autodrain,upstream
chaos: vendor
	$(GO) run ./internal/nemesis/cmd/chaos -duration $(DURATION) -seeds $(SEED) -modes $(MODES) -out .cache/chaos

## bench: the headline scenarios, pristine against the patched build in legacy and drainer modes (go-floor in the drain), 3 reps (6 minutes);
## report in .cache/bench/quick/BENCHMARKS.md. FULL=1: the whole suite, as bench-full (the runner's -plan quick or full)
bench: vendor
	scripts/bench -plan $(if $(FULL),full,quick)

## bench-full: the whole A/B suite (every scenario, variant and section, 3 reps; about 50 minutes); writes BENCHMARKS.md and benchmarks/results
bench-full: vendor
	scripts/bench -plan full

## ab: pristine against patched (drainer mode) through benchstat, on a subset (scripts/ab -h)
ab: vendor
	scripts/ab

## bench-smoke: every scenario once at smoke-test sizes, report under .cache (part of make test)
bench-smoke: vendor
	scripts/bench -quick -reps 1 -report .cache/bench/smoke/BENCHMARKS.md -results .cache/bench/smoke

## lint: gofmt, go vet and staticcheck over our code and the overlay inside the vendored tree
lint: vendor
	scripts/lint

## upstream-tests: upstream's own suite (-race, unit + integration) on the patched tree, default mode
upstream-tests: vendor
	scripts/upstream-tests --tree patched --mode upstream

## upstream-tests-pristine: the same suite on the pristine release; rewrites the reference
upstream-tests-pristine:
	scripts/upstream-tests --tree pristine --write-reference

## thirdparty: watermill-amqp's and gocloud rabbitpubsub's suites at full size in pristine, default and drainer modes, judged against pristine (make test runs them at short sizes);
## legacy-autodrain at short sizes only (its full size took over an hour while writes waited for the drain loop's reads; not measured since they stopped waiting)
thirdparty: vendor
	scripts/thirdparty-tests --full --mode default --mode drainer
	scripts/thirdparty-tests --subset --mode legacy-autodrain

## actionlint: lint the GitHub workflows
actionlint:
	$(GO) run $(ACTIONLINT) -no-color

## modfiles: regenerate go.upstream.mod/go.upstream.sum from go.mod/go.sum
modfiles:
	scripts/sync-modfiles

## rebase: move onto a new amqp091-go release, e.g. make rebase VERSION=v1.17.0 (FULL=1: upstream's whole suite in every mode; ACCEPT_DRIFT=1 after reviewing the drift); see PATCHES.md
rebase:
	@test -n "$(VERSION)" || { echo "make rebase VERSION=vX.Y.Z [FULL=1] [ACCEPT_DRIFT=1]" >&2; exit 2; }
	scripts/rebase $(if $(FULL),--full) $(if $(ACCEPT_DRIFT),--accept-drift) $(VERSION)

## canary: when the module proxy has a newer amqp091-go than the PIN, rebase a scratch copy onto it and run upstream's suite in every mode (needs RabbitMQ)
canary:
	scripts/canary $(VERSION)

## drift: check the drift guards (upstream/guards.txt) against the pinned release
drift:
	scripts/drift
