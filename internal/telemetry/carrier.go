package telemetry

import (
	"context"
	"strings"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Propagator is the W3C trace-context and baggage propagator streamd uses
// everywhere, whatever the global one is (Install also makes it global).
var Propagator propagation.TextMapPropagator = propagation.NewCompositeTextMapPropagator(
	propagation.TraceContext{}, propagation.Baggage{})

// HeaderCarrier adapts NATS message headers (nats.Header is a
// map[string][]string: convert with HeaderCarrier(msg.Header)) to a
// propagation.TextMapCarrier. Keys are written as given ("traceparent");
// Get also finds them in another case, since some clients canonicalize.
type HeaderCarrier map[string][]string

// Get returns the first value of key.
func (h HeaderCarrier) Get(key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	for k, v := range h {
		if len(v) > 0 && strings.EqualFold(k, key) {
			return v[0]
		}
	}
	return ""
}

// Set replaces the values of key.
func (h HeaderCarrier) Set(key, value string) { h[key] = []string{value} }

// Keys lists the keys.
func (h HeaderCarrier) Keys() []string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	return keys
}

// MapCarrier adapts the trace-context field of a control message
// (map[string]string) to a propagation.TextMapCarrier.
type MapCarrier = propagation.MapCarrier

// InjectHeaders writes ctx's trace context into NATS headers h, which must not
// be nil. Without a valid span context in ctx it writes nothing.
func InjectHeaders(ctx context.Context, h map[string][]string) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	Propagator.Inject(ctx, HeaderCarrier(h))
}

// ExtractHeaders returns ctx with the remote span context found in NATS
// headers h (nil or empty: ctx unchanged). Spans started from the result are
// children of the sender's span.
func ExtractHeaders(ctx context.Context, h map[string][]string) context.Context {
	if len(h) == 0 {
		return ctx
	}
	return Propagator.Extract(ctx, HeaderCarrier(h))
}

// InjectMap returns ctx's trace context as a map for a control message, or
// nil when ctx has no valid span context (nothing to send, nothing allocated).
func InjectMap(ctx context.Context) map[string]string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return nil
	}
	m := make(map[string]string, 2)
	Propagator.Inject(ctx, MapCarrier(m))
	return m
}

// ExtractMap returns ctx with the remote span context found in m (a control
// message's trace-context field; nil: ctx unchanged).
func ExtractMap(ctx context.Context, m map[string]string) context.Context {
	if len(m) == 0 {
		return ctx
	}
	return Propagator.Extract(ctx, MapCarrier(m))
}
