package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/streamd/streamd/internal/natsutil"
	"github.com/streamd/streamd/internal/testwasm"
)

// TestRunNATS: `streamd run` of a job file whose nats source and sink name
// no url connects to nats.url (here STREAMD_NATS_URL); validate describes
// them; without a server the job fails naming the source and the URL.
func TestRunNATS(t *testing.T) {
	upper := testwasm.Path(t, "examples/wasm/uppercase/uppercase.wasm")
	srv, err := natsutil.StartEmbedded(natsutil.EmbeddedOptions{Port: -1, NoLog: true, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, sc := range []jetstream.StreamConfig{{Name: "LINES", Subjects: []string{"lines.>"}}, {Name: "UPPER", Subjects: []string{"upper.>"}, AllowAtomicPublish: true}} {
		if _, err := js.CreateStream(ctx, sc); err != nil {
			t.Fatal(err)
		}
	}
	const n = 100
	for i := 0; i < n; i++ {
		if _, err := js.Publish(ctx, fmt.Sprintf("lines.s%d", i%3), fmt.Appendf(nil, "line %d", i)); err != nil {
			t.Fatal(err)
		}
	}

	dir := t.TempDir()
	job := fmt.Sprintf(`name: nats-upper
parallelism: 2
operators:
  - uid: lines
    source: {type: nats, stream: LINES, bounded: true, key_from: subject}
  - uid: upper
    wasm: %s
    inputs: [lines]
  - uid: out
    sink: {type: nats, subject: upper.lines}
    inputs: [upper]
`, upper)
	must(t, os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(job), 0o644))

	t.Setenv("STREAMD_NATS_URL", srv.URL())
	r := run(t, dir, "", "validate", "job.yaml")
	if r.code != 0 || !strings.Contains(r.stdout, "source nats stream LINES bounded") || !strings.Contains(r.stdout, "sink nats subject upper.lines") {
		t.Fatalf("validate: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	r = run(t, dir, "", "run", "--progress", "off", "job.yaml")
	if r.code != 0 {
		t.Fatalf("run: exit %d\nstderr:\n%s", r.code, r.stderr)
	}
	if !strings.Contains(r.stderr, `output of "out": NATS subject upper.lines`) {
		t.Errorf("run does not say where the output went:\n%s", r.stderr)
	}
	out, err := js.Stream(ctx, "UPPER")
	if err != nil {
		t.Fatal(err)
	}
	info, err := out.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got, want []string
	for seq := uint64(1); seq <= info.State.LastSeq; seq++ {
		m, err := out.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, m.Header.Get("Streamd-Key")+"="+string(m.Data))
	}
	for i := 0; i < n; i++ {
		want = append(want, fmt.Sprintf("s%d=LINE %d", i%3, i))
	}
	sort.Strings(got)
	sort.Strings(want)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("output stream: %d messages %q..., want %d %q...", len(got), got[:min(3, len(got))], len(want), want[:3])
	}

	// No server at nats.url: the first of the source and the sink to open
	// fails the job and says where it tried.
	t.Setenv("STREAMD_NATS_URL", "nats://127.0.0.1:1")
	r = run(t, dir, "", "run", "--progress", "off", "job.yaml")
	named := strings.Contains(r.stderr, `operator "lines" subtask`) && strings.Contains(r.stderr, "phase open: nats source: ") ||
		strings.Contains(r.stderr, `operator "out" subtask`) && strings.Contains(r.stderr, "phase open: nats sink: ")
	if r.code != 1 || !named || !strings.Contains(r.stderr, "connect to nats://127.0.0.1:1") {
		t.Errorf("run without a server: exit %d, want 1 and an error naming the operator, the connector and the URL\nstderr:\n%s", r.code, r.stderr)
	}
}
