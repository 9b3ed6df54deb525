package wire

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/streamd/streamd/internal/testlog"
)

// fakeFetch fails with errs in turn, then returns a path; it records the
// times of its calls and whether each had a deadline (the try timeout).
type fakeFetch struct {
	errs     []error
	calls    []time.Time
	deadline []bool
}

func (f *fakeFetch) fetch(ctx context.Context, _ string, art Artifact) (string, error) {
	f.calls = append(f.calls, time.Now())
	_, ok := ctx.Deadline()
	f.deadline = append(f.deadline, ok)
	if n := len(f.calls); n <= len(f.errs) {
		return "", f.errs[n-1]
	}
	return "/cache/" + art.Name, nil
}

func testArtifacts(f *fakeFetch, p RetryPolicy) *Artifacts {
	return &Artifacts{Retry: p, TryTimeout: time.Second, fetch: f.fetch}
}

var testArt = Artifact{Name: "op.wasm", Digest: "sha256:" + strings.Repeat("ab", 32), Size: 3}

// TestFetchRetriesTransientErrors: a fetch that times out and then meets
// NATS reconnecting is tried again after 10ms and 20ms (the backoff
// doubles), succeeds on the third try, and each retry is logged at warn.
func TestFetchRetriesTransientErrors(t *testing.T) {
	f := &fakeFetch{errs: []error{
		fmt.Errorf("cluster: fetch artifact op.wasm: %w", context.DeadlineExceeded), // the try's timeout
		fmt.Errorf("cluster: fetch artifact op.wasm: %w", nats.ErrConnectionReconnecting),
	}}
	logs := testlog.New()
	a := testArtifacts(f, RetryPolicy{Initial: 10 * time.Millisecond, Max: time.Second, Total: time.Minute})
	path, err := a.FetchRetry(context.Background(), "/cache", testArt, slog.New(logs))
	if err != nil || path != "/cache/op.wasm" {
		t.Fatalf("FetchRetry: %q, %v; want /cache/op.wasm", path, err)
	}
	if len(f.calls) != 3 {
		t.Fatalf("%d tries, want 3", len(f.calls))
	}
	for i, ok := range f.deadline {
		if !ok {
			t.Errorf("try %d had no deadline (TryTimeout)", i+1)
		}
	}
	for i, want := range []time.Duration{10 * time.Millisecond, 20 * time.Millisecond} {
		if got := f.calls[i+1].Sub(f.calls[i]); got < want {
			t.Errorf("retry %d after %s, want at least %s", i+1, got, want)
		}
	}
	var retries []testlog.Record
	for _, r := range logs.Records() {
		if strings.Contains(r.Msg, "retrying") {
			retries = append(retries, r)
		}
	}
	if len(retries) != 2 || retries[0].Level != "WARN" || !strings.Contains(retries[1].Attrs["err"], "reconnecting") {
		t.Errorf("retry logs %+v: want two warnings, the second about reconnecting", retries)
	}
}

// TestFetchPermanentErrorsFailAtOnce: a missing object, a digest mismatch or
// a bad digest are not retried.
func TestFetchPermanentErrorsFailAtOnce(t *testing.T) {
	for _, perm := range []error{
		fmt.Errorf("%w: fetch artifact op.wasm: %w", ErrArtifactMissing, jetstream.ErrObjectNotFound),
		fmt.Errorf("%w: fetch artifact op.wasm: content has digest sha256:00, want ...", ErrDigestMismatch),
		Permanent(errors.New("cluster: artifact op.wasm: digest \"x\" is not sha256:<hex>")),
	} {
		f := &fakeFetch{errs: []error{perm}}
		a := testArtifacts(f, RetryPolicy{Initial: time.Millisecond, Max: time.Millisecond, Total: time.Minute})
		_, err := a.FetchRetry(context.Background(), "/cache", testArt, nil)
		if err == nil || err.Error() != perm.Error() || len(f.calls) != 1 {
			t.Errorf("permanent %q: %d tries, error %v; want one try and the error as is", perm, len(f.calls), err)
		}
	}
	// The real Fetch names a bad digest as permanent too.
	a := &Artifacts{}
	_, err := a.Fetch(context.Background(), t.TempDir(), Artifact{Name: "x", Digest: "md5:1"})
	if err == nil || Transient(err) {
		t.Errorf("bad digest: %v, transient %v; want a permanent error", err, Transient(err))
	}
}

// TestFetchRetryGivesUp: a fetch that keeps timing out fails after the
// policy's total time, with the last error and the number of tries; the end
// of the attempt's context stops the retries at once.
func TestFetchRetryGivesUp(t *testing.T) {
	timeouts := make([]error, 100)
	for i := range timeouts {
		timeouts[i] = nats.ErrTimeout
	}
	f := &fakeFetch{errs: timeouts}
	a := testArtifacts(f, RetryPolicy{Initial: 5 * time.Millisecond, Max: 20 * time.Millisecond, Total: 150 * time.Millisecond})
	start := time.Now()
	_, err := a.FetchRetry(context.Background(), "/cache", testArt, nil)
	if !errors.Is(err, nats.ErrTimeout) || !strings.Contains(err.Error(), "still failing after") {
		t.Fatalf("error %v: want the timeout, still failing after some tries", err)
	}
	if d := time.Since(start); d > 2*time.Second || len(f.calls) < 3 {
		t.Errorf("gave up after %s and %d tries: want a few tries within about 150ms", d, len(f.calls))
	}

	f = &fakeFetch{errs: timeouts}
	a = testArtifacts(f, RetryPolicy{Initial: time.Hour, Max: time.Hour, Total: 10 * time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(20*time.Millisecond, cancel)
	_, err = a.FetchRetry(ctx, "/cache", testArt, nil)
	if !errors.Is(err, context.Canceled) || !errors.Is(err, nats.ErrTimeout) || len(f.calls) != 1 {
		t.Errorf("canceled attempt: %v after %d tries; want the timeout and the cancel after one try", err, len(f.calls))
	}
}

func TestTransient(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{nats.ErrTimeout, true},
		{fmt.Errorf("x: %w", nats.ErrDisconnected), true},
		{nats.ErrNoResponders, true},
		{&jetstream.APIError{Code: 503, Description: "JetStream system temporarily unavailable"}, true},
		{jetstream.ErrJetStreamNotEnabled, false},
		{nats.ErrConnectionClosed, false},
		{context.Canceled, false},
		{jetstream.ErrObjectNotFound, false},
		// The object store's own check of what it read: a NATS cluster
		// read the object before its chunks were all there.
		{fmt.Errorf("cluster: fetch artifact op.wasm: %w", jetstream.ErrDigestMismatch), true},
		{fmt.Errorf("%w: fetch artifact op.wasm: content has digest sha256:00", ErrDigestMismatch), false},
		{errors.New("something else"), false},
		{Permanent(nats.ErrTimeout), false},
	} {
		if got := Transient(c.err); got != c.want {
			t.Errorf("Transient(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
