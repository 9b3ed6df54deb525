# A standalone nats-server binary for `make test-long`: the multi-host tests
# (test/cluster, build tag long) run against it as a separate process and as a
# 3-node cluster on loopback. Built from the Go module proxy; not part of
# WASM_TARGETS or `make test`.
NATS_SERVER := bin/nats-server
NATS_SERVER_VERSION := v2.15.3

$(NATS_SERVER):
	@mkdir -p bin
	GOBIN=$(CURDIR)/bin $(GO) install github.com/nats-io/nats-server/v2@$(NATS_SERVER_VERSION)

.PHONY: nats-server
nats-server: $(NATS_SERVER)

test-long: $(NATS_SERVER)
