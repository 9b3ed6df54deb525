package kafka

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
)

// Test hooks of the exactly-once sink inside a streamd process (the
// end-to-end tests run `streamd run` as a child process and kill it): set
// in the environment, they are not an option for users.
const (
	// EnvTestSkipMarker "1" makes restores commit the restored entries
	// without reading the markers (Sink.skipMarkerCheck): the tests show
	// that without it the output has duplicates.
	EnvTestSkipMarker = "STREAMD_TEST_KAFKA_SINK_SKIP_MARKER"
	// EnvTestStall "POINT:N" makes the N-th sink commit (of any subtask of
	// the process) that reaches POINT print "kafka sink: test stall at
	// POINT" on stderr and wait for ever, so that a test kills the process
	// exactly there. POINT is one of TestStallPoints.
	EnvTestStall = "STREAMD_TEST_KAFKA_SINK_STALL"
)

// Commit points outside the transaction at which failHook is called too.
const (
	hookCommit    = "commit"    // the checkpoint is complete, its entry's transaction not begun
	hookCommitted = "committed" // the transaction committed, the entry still in the sink's state
)

// TestStallPoints are the points EnvTestStall names, in the order a commit
// reaches them: after the checkpoint completed and before the transaction,
// records produced, marker committed in the open transaction, transaction
// committed.
var TestStallPoints = []string{hookCommit, hookProduced, hookMarked, hookCommitted}

var stallCount atomic.Int64

// testHooksFromEnv applies EnvTestSkipMarker and EnvTestStall to s.
func (s *Sink) testHooksFromEnv() error {
	s.skipMarkerCheck = os.Getenv(EnvTestSkipMarker) == "1"
	v := os.Getenv(EnvTestStall)
	if v == "" {
		return nil
	}
	point, ns, _ := strings.Cut(v, ":")
	n, err := strconv.Atoi(ns)
	if err != nil || n < 1 || !slices.Contains(TestStallPoints, point) {
		return fmt.Errorf("%s=%q: want POINT:N with POINT one of %v and N >= 1", EnvTestStall, v, TestStallPoints)
	}
	s.failHook = func(at string, _ *entry) error {
		if at == point && stallCount.Add(1) == int64(n) {
			fmt.Fprintf(os.Stderr, "kafka sink: test stall at %s\n", point)
			select {}
		}
		return nil
	}
	return nil
}
