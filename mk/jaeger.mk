# Jaeger v2, built from the Go module proxy in its own module (tools/jaeger) so
# streamd's go.mod stays small. Used by `make test-long` (the tracing tests read
# traces back through its query API) and for looking at traces locally:
#   make bin/jaeger && bin/jaeger --config tools/jaeger/jaeger-loopback.yaml
# Not part of WASM_TARGETS or `make test`. About a minute with a warm module
# cache, up to ten cold. (`go install` refuses jaeger's replace directives.)
JAEGER := bin/jaeger

$(JAEGER): tools/jaeger/go.mod tools/jaeger/go.sum
	@mkdir -p bin
	cd tools/jaeger && $(GO) build -o ../../$(JAEGER) github.com/jaegertracing/jaeger/cmd/jaeger

.PHONY: jaeger
jaeger: $(JAEGER)

test-long: $(JAEGER)
