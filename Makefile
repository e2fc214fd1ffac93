# protoevents — the commands a newcomer needs. Everything installs itself:
# buf is built from the Go module proxy into ./bin, the plugins run from
# go.mod, Postgres is started as a throwaway cluster when no URL is given,
# and Kafka is an in-process cluster unless PROTOEVENTS_KAFKA_BROKERS is set.
# The real-broker tier (test-kafka, demo KAFKA=apache) fetches Apache Kafka
# through Maven and needs a JDK 17+ and mvn.

# Recipes run in bash with pipefail, so a failing command piped into grep
# (make stall) still fails the target.
SHELL       := bash
.SHELLFLAGS := -o pipefail -c

GO          ?= go
BIN         := $(CURDIR)/bin
BUF_VERSION := v1.75.0
BUF         := $(BIN)/buf
export PATH := $(BIN):$(PATH)

# Packages whose tests also run under the race detector: the runtime and
# everything that runs it end to end.
RACE_PKGS   := ./runtime/... ./eventstest/... ./examples/... ./cmd/eventsctl/...

.PHONY: all build generate check-generated test test-kafka lint demo bench bench-kafka tools clean

all: build

$(BUF):
	GOBIN=$(BIN) $(GO) install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)

tools: $(BUF)

## build: compile everything, including the plugin and the CLIs into ./bin
build:
	$(GO) build ./...
	GOBIN=$(BIN) $(GO) install ./cmd/...

## generate: regenerate Go code, golden files and events.lock from the schemas
generate: $(BUF)
	$(BUF) generate

## check-generated: fail if committed generated code is not what buf generates
check-generated: generate
	@git diff --exit-code --stat -- . || { echo "generated code is stale: run 'make generate' and commit"; exit 1; }
	@test -z "$$(git status --porcelain --untracked-files=all -- '*.pb.go' '*.events.go' '*.lock')" || { git status --porcelain; echo "untracked generated files: run 'make generate' and commit"; exit 1; }

## lint: go vet, gofmt and buf lint
lint: $(BUF)
	$(GO) vet ./...
	@out="$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))"; test -z "$$out" || { echo "gofmt needed:"; echo "$$out"; exit 1; }
	$(BUF) lint

## test: lint, all tests, and the runtime's tests again under -race
test: lint
	$(GO) test ./...
	$(GO) test -race $(RACE_PKGS)

# Apache Kafka lines the real tier runs on: the oldest and the newest tested
# (README, "Tested brokers").
KAFKA_VERSIONS ?= 3.9.2 4.4.0
# Packages whose tests talk to Kafka (the others already ran in make test);
# internal/brokerfaults is the three-node fault suite.
KAFKA_PKGS  := ./runtime/consumer ./runtime/outbox ./runtime/walrelay ./runtime/topics ./runtime/saga \
               ./runtime/envelope ./runtime/otelmetrics ./eventstest/... ./examples/... ./cmd/eventsctl \
               ./internal/brokerfaults

## test-kafka: every Kafka-dependent test on real Apache Kafka (JDK + Maven), once per
## version in KAFKA_VERSIONS; the broker-fault tests on a three-node cluster
test-kafka:
	@for v in $(KAFKA_VERSIONS); do \
	  echo "== Apache Kafka $$v"; \
	  PROTOEVENTS_TEST_KAFKA=apache PROTOEVENTS_KAFKA_VERSION=$$v $(GO) test -count=1 -timeout 30m $(KAFKA_PKGS) || exit 1; \
	done

## demo: generate, then run orders → outbox → relay → Kafka → shipping end to end
## (RELAY=wal: the producers write to the WAL and the WAL relay streams it;
## KAFKA=apache: on a real Apache Kafka node instead of the embedded broker)
RELAY ?= table
KAFKA ?= embedded
demo: $(BUF)
	$(BUF) generate
	$(GO) run ./examples/cmd/demo -relay $(RELAY) -kafka $(KAFKA)

## bench: Go benchmarks, then protoevents beside Watermill (bench/watermill, its own
## module), with the ratios the performance targets are stated in
bench:
	$(GO) run ./bench/report -count 5 -watermill-rounds 3

## bench-kafka: the same report with every side (our relays and consumer, Watermill) on one
## real Apache Kafka node instead of the embedded broker (JDK + Maven)
bench-kafka:
	$(GO) run ./internal/cmd/apachekafka -- $(GO) run ./bench/report -count 3 -watermill-rounds 3

.PHONY: stall

## stall: the longest stretch without progress of a 3-process consumer group under a kill every
## 4.5s (about a minute); STALL=hb,session,rebalance tries other group timeouts, KAFKA=apache
## runs it on a real Apache Kafka node (the real group coordinator)
STALL ?= 1
stall:
	$(if $(filter apache,$(KAFKA)),$(GO) run ./internal/cmd/apachekafka --,) env PROTOEVENTS_STALL=$(STALL) $(GO) test ./runtime/consumer/ -run '^TestRebalanceStall$$' -count=1 -v -timeout 10m | grep -E '^(rebalance stall|--- |ok|FAIL)'

clean:
	rm -rf $(BIN)
