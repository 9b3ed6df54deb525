package main

import (
	"strings"
	"testing"

	"github.com/streamd/streamd/internal/cluster/wire"
)

// TestUpgradeOutcome: upgrade waits until the new version runs, or was
// rolled back and the rollback runs or failed, and says which.
func TestUpgradeOutcome(t *testing.T) {
	v := func(n int, state, reason string, rerun int) wire.VersionStatus {
		return wire.VersionStatus{Version: n, State: state, Reason: reason, Rerun: rerun}
	}
	rep := wire.UpgradeReply{Version: 2, Savepoint: "jetstream://B/j/savepoint-3-j"}
	for _, tt := range []struct {
		name     string
		versions []wire.VersionStatus
		state    string
		decided  bool
		err      string // "" = success
	}{
		{"starting", []wire.VersionStatus{v(1, "replaced", "", 0), v(2, "starting", "", 0)}, "restarting", false, ""},
		{"running", []wire.VersionStatus{v(1, "replaced", "", 0), v(2, "running", "", 0)}, "running", true, ""},
		{"rollback starting", []wire.VersionStatus{v(1, "replaced", "", 0), v(2, "rolled back", "boom", 0), v(3, "starting", "", 1)}, "created", false, ""},
		{"rolled back", []wire.VersionStatus{v(1, "replaced", "", 0), v(2, "rolled back", "boom", 0), v(3, "running", "", 1)}, "running", true,
			"job j: version 2 failed: boom; rolled back: version 1 runs again (as version 3) from savepoint jetstream://B/j/savepoint-3-j"},
		{"rollback failed", []wire.VersionStatus{v(1, "replaced", "", 0), v(2, "rolled back", "boom", 0), v(3, "failed", "bang", 1)}, "failed", true,
			"job j: version 2 failed: boom; the rollback to version 1 from savepoint jetstream://B/j/savepoint-3-j did not run either (failed: bang); the job is failed (streamd deploy --from jetstream://B/j/savepoint-3-j starts it)"},
		{"canceled", []wire.VersionStatus{v(1, "replaced", "", 0), v(2, "canceled", "canceled by request", 0)}, "canceled", true,
			"job j: version 2 canceled before it ran: canceled by request"},
	} {
		st := &wire.JobStatus{ID: "j", State: tt.state, Versions: tt.versions}
		if got := upgradeDecided(st, 2); got != tt.decided {
			t.Errorf("%s: decided %v, want %v", tt.name, got, tt.decided)
		}
		if !tt.decided {
			continue
		}
		res, err := upgradeOutcome(st, rep)
		switch {
		case tt.err == "" && err != nil, tt.err != "" && (err == nil || err.Error() != tt.err):
			t.Errorf("%s: error %v, want %q", tt.name, err, tt.err)
		case res.Version != 2 || res.State != tt.versions[1].State || len(res.Versions) != len(tt.versions):
			t.Errorf("%s: result %+v", tt.name, res)
		}
	}
	if got := shortDigest("sha256:20e382195e07c656a22d4f8ad0e0dd4c"); got != "sha256:20e382195e07" || !strings.HasPrefix(shortDigest("x"), "x") {
		t.Errorf("shortDigest: %q", got)
	}
}
