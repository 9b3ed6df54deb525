package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestBenchNexmarkUsage: bad queries, counts and backends are usage errors
// (exit 2) that name what is wrong, before anything runs.
func TestBenchNexmarkUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "nexmark", "q0,q6"}, `unknown query "q6"`},
		{[]string{"bench", "nexmark", "q0", "--events", "ten"}, `--events: "ten" is not a positive count`},
		{[]string{"bench", "nexmark", "q5", "--backends", "rocksdb"}, `--backends: "rocksdb" is not a state backend`},
		{[]string{"bench", "nexmark"}, `want 1 argument(s), got 0`},
	} {
		var out, errb bytes.Buffer
		code := newCLI(strings.NewReader(""), &out, &errb).execute(context.Background(), tc.args)
		if code != exitUsage || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d and %q", tc.args, code, errb.String(), exitUsage, tc.want)
		}
	}
}
