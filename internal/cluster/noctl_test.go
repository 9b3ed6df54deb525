package cluster

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/internal/natstest"
)

// TestNoControllerAnswers: a request to a NATS server where no controller
// runs says so, whether the request's own timeout ends it (streamd status
// --request-timeout 3s) or the leader wait does, not "context deadline
// exceeded" alone; the request's timeout still matches with errors.Is.
func TestNoControllerAnswers(t *testing.T) {
	srv := natstest.Server(t)
	c, err := NewClient(natstest.Connect(t, srv.URL()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_, err = c.Status(ctx, "x")
	if err == nil || !strings.Contains(err.Error(), "no controller") || !strings.Contains(err.Error(), "timed out") || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("request timeout: %v, want no controller answered before the request timed out", err)
	}
	c.LeaderWait = 300 * time.Millisecond
	_, err = c.Status(context.Background(), "x")
	if err == nil || !strings.Contains(err.Error(), "no controller listens on") {
		t.Fatalf("leader wait: %v, want no controller listens", err)
	}
}
