package cluster_test

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/testwasm"
)

// logsJob writes a never-ending job whose guest (the conformance operator,
// parallelism 2) logs "open" when it opens and "notify" after every
// checkpoint, every 200ms.
func logsJob(t *testing.T) string {
	t.Helper()
	wasm := testwasm.Path(t, "internal/conformance/guests/go/conformance.wasm")
	job := `name: logs
checkpoint: {interval: 200ms, storage: jetstream}
operators:
  - uid: gen
    source: {type: generator, rate: 100}
  - uid: conf
    wasm: ` + wasm + `
    parallelism: 2
    inputs: [{from: gen, partition: hash}]
  - uid: out
    sink: {type: discard}
    inputs: [{from: conf, partition: rebalance}]
`
	path := filepath.Join(t.TempDir(), "logs.yaml")
	if err := os.WriteFile(path, []byte(job), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestBinaryLogs: `streamd logs -f` shows a guest's line within a second of
// the guest writing it and ends with exit 0 on Ctrl-C; without -f it prints
// what is stored, filtered by --operator and --subtask, and exits; an
// unknown job and a missing stream get clear errors.
func TestBinaryLogs(t *testing.T) {
	url := startServer(t, nil)
	env := []string{"STREAMD_NATS_URL=" + url}
	out, errs, code := streamd(t, env, "deploy", logsJob(t))
	if code != 0 {
		t.Fatalf("deploy: exit %d: %s", code, errs)
	}
	id := strings.TrimSpace(out)

	// Follow: a "notify" written after logs -f started arrives within 1s.
	cmd := exec.Command(streamdBin(t), "logs", "-f", "--json", id)
	cmd.Env = append(os.Environ(), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	pr, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	recs := make(chan wire.LogRecord, 1024)
	go func() {
		defer close(recs)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			var r wire.LogRecord
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
				t.Errorf("logs --json printed %q: %v", sc.Text(), err)
				continue
			}
			r.Attrs = map[string]string{"received": time.Now().Format(time.RFC3339Nano)}
			recs <- r
		}
	}()
	opened := map[int]bool{}
	var live *wire.LogRecord
	timeout := time.After(30 * time.Second)
	for live == nil || len(opened) < 2 {
		select {
		case r, ok := <-recs:
			if !ok {
				t.Fatalf("logs -f ended: %s", stderr.String())
			}
			if r.Job != id || r.Host == "" {
				t.Fatalf("record of job %q on host %q, want job %s and a host", r.Job, r.Host, id)
			}
			if r.Source != "guest" || r.Operator != "conf" || r.Subtask == nil {
				continue
			}
			switch {
			case r.Msg == "open":
				opened[*r.Subtask] = true
			case r.Msg == "notify" && r.Time.After(started) && live == nil:
				received, _ := time.Parse(time.RFC3339Nano, r.Attrs["received"])
				if lag := received.Sub(r.Time); lag > time.Second {
					t.Fatalf("a guest line written at %s arrived %s later, want within 1s", r.Time.Format(time.StampMilli), lag)
				}
				live = &r
			}
		case <-timeout:
			t.Fatalf("after 30s: live notify %v, opened subtasks %v; stderr: %s", live != nil, opened, stderr.String())
		}
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("logs -f after Ctrl-C: %v (want exit 0): %s", err, stderr.String())
	}

	// No -f: what is stored, filtered, then exit.
	out, errs, code = streamd(t, env, "logs", "--operator", "conf", "--subtask", "1", id)
	if code != 0 {
		t.Fatalf("logs --operator conf --subtask 1: exit %d: %s", code, errs)
	}
	lineRE := regexp.MustCompile(`^\d\d:\d\d:\d\d\.\d{3} conf\[1\]@\S+ attempt \d+ (INFO|WARN|ERROR) `)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	sawOpen := false
	for _, l := range lines {
		if !lineRE.MatchString(l) {
			t.Fatalf("logs --operator conf --subtask 1 printed %q, want only conf[1]'s lines:\n%s", l, out)
		}
		sawOpen = sawOpen || strings.HasSuffix(l, " INFO guest: open")
	}
	if !sawOpen {
		t.Fatalf("no guest: open line for conf[1]:\n%s", out)
	}
	// --since keeps the recent lines only: none written before it.
	before := time.Now()
	out, errs, code = streamd(t, env, "logs", "--json", "--since", "1ms", "--operator", "conf", id)
	if code != 0 {
		t.Fatalf("logs --since 1ms: exit %d: %s", code, errs)
	}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if l == "" {
			continue
		}
		var r wire.LogRecord
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("logs --json printed %q: %v", l, err)
		}
		if r.Operator != "conf" || r.Time.Before(before.Add(-time.Second)) {
			t.Fatalf("logs --since 1ms --operator conf printed a line of %s at %s (before %s)", r.Operator, r.Time, before)
		}
	}

	// An unknown job, then the stream gone.
	_, errs, code = streamd(t, env, "logs", "nosuch-job")
	if code != 1 || !strings.Contains(errs, `no job "nosuch-job"`) {
		t.Fatalf("logs of an unknown job: exit %d: %s", code, errs)
	}
	js, err := jetstream.New(connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteStream(context.Background(), wire.LogStream); err != nil {
		t.Fatal(err)
	}
	_, errs, code = streamd(t, env, "logs", id)
	if code != 1 || !strings.Contains(errs, "no log stream "+wire.LogStream) {
		t.Fatalf("logs without the stream: exit %d: %s", code, errs)
	}
}

// TestBinaryLogsControllerEvents: streamd logs shows the controller's
// decisions about the job beside the hosts' lines: its deploy, placement,
// and a stop with the savepoint's path; the host does not claim an empty
// savepoint.
func TestBinaryLogsControllerEvents(t *testing.T) {
	url := startServer(t, nil)
	env := []string{"STREAMD_NATS_URL=" + url}
	out, errs, code := streamd(t, env, "deploy", logsJob(t))
	if code != 0 {
		t.Fatalf("deploy: exit %d: %s", code, errs)
	}
	id := strings.TrimSpace(out)
	sp, errs, code := "", "", 0
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if sp, errs, code = streamd(t, env, "stop", id); code == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stop: exit %d: %s", code, errs)
		}
	}
	sp = strings.TrimSpace(sp)
	want := []string{" job@controller attempt 0 INFO job deployed ", " job@controller attempt 0 INFO job scheduled ",
		" job@controller attempt 0 INFO job stopped ", "savepoint=" + sp}
	var got string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		got, errs, code = streamd(t, env, "logs", id)
		missing := ""
		for _, w := range want {
			if !strings.Contains(got, w) {
				missing = w
			}
		}
		if code == 0 && missing == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("logs (exit %d, %s) lacks %q:\n%s", code, errs, missing, got)
		}
	}
	if strings.Contains(got, `savepoint=""`) {
		t.Errorf("a line claims an empty savepoint:\n%s", got)
	}
}
