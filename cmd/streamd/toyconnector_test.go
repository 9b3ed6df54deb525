package main

// This file is a whole connector: a source and a sink registered with the
// connector registry, and nothing else in the code base knows them. The
// tests below use them from a job file, `streamd validate`, `streamd run`
// (checkpointed) and the deploy path (a JobSpec as it travels to the
// hosts): adding a connector is one file and its test.

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/connector"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/webapi"
)

func init() {
	if err := connector.RegisterSetting(connector.Setting{Key: "toy.suffix", Flag: "toy-suffix", Usage: "put after every toy_counter value"}); err != nil {
		panic(err)
	}
	connector.MustRegisterSource("toy_counter", connector.NewConfigSpec().
		Summary("Counts: subtask i of p emits prefix+n for n = i, i+p, ... below count.").
		Field(
			connector.NewIntField("count").Description("How far to count.").Require("a toy_counter counts up to count"),
			connector.NewStringField("prefix").Description("Put before each number.").Default("n-"),
			connector.NewStringField("case").Description("Of the prefix.").Default("lower").OneOf("case", "lower", "upper"),
			connector.NewDurationField("delay").Description("Wait this long before each record.").Default(time.Duration(0)),
		).
		Check(func(c connector.Config) []connector.FieldError {
			if n := c.Int("count"); n < 1 {
				return []connector.FieldError{connector.Errorf("count", "must be at least 1, got %d", n)}
			}
			return nil
		}), newToyCounter)
	connector.MustRegisterSink("toy_lines", connector.NewConfigSpec().
		Summary("Keeps every value in memory, by the sink's name.").
		Field(connector.NewStringField("name").Description("Where the values go.").Require("name the toy_lines sink")),
		func(s *connector.SinkSpec, env connector.SinkEnv) (connector.Sink, error) {
			return &toyLines{name: s.Conf().String("name")}, nil
		})
}

// toyCounter is the toy source; its position is the next n, 8 bytes.
type toyCounter struct {
	next, count, step int64
	prefix, suffix    string
	delay             time.Duration
	buf               []byte
}

func newToyCounter(s *connector.SourceSpec, env connector.SourceEnv) (connector.Source, error) {
	c := s.Conf()
	t := &toyCounter{next: int64(env.Subtask), count: c.Int("count"), step: int64(env.Parallelism), prefix: c.String("prefix"), delay: c.Duration("delay")}
	if c.String("case") == "upper" {
		t.prefix = strings.ToUpper(t.prefix)
	}
	t.suffix = env.Settings["toy.suffix"]
	if env.Position != nil {
		if len(env.Position) != 8 {
			return nil, fmt.Errorf("toy_counter: bad position %x", env.Position)
		}
		t.next = int64(binary.BigEndian.Uint64(env.Position))
	}
	return t, nil
}

func (t *toyCounter) Read(ctx context.Context, recs []abi.Record) (int, error) {
	t.buf = t.buf[:0]
	n := 0
	if t.delay > 0 && t.next < t.count {
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(t.delay):
		}
		recs = recs[:1]
	}
	for ; n < len(recs) && t.next < t.count; n++ {
		at := len(t.buf)
		t.buf = fmt.Appendf(t.buf, "%s%d%s", t.prefix, t.next, t.suffix)
		recs[n] = abi.Record{Value: t.buf[at:len(t.buf):len(t.buf)], Timestamp: abi.NoTimestamp}
		t.next += t.step
	}
	if n == 0 {
		return 0, io.EOF
	}
	return n, nil
}

func (t *toyCounter) Watermark() int64 { return abi.MinWatermark }
func (t *toyCounter) Position() []byte { return binary.BigEndian.AppendUint64(nil, uint64(t.next)) }
func (t *toyCounter) Close() error     { return nil }

// toyOut holds what the toy_lines sinks wrote, by name.
var toyOut = struct {
	sync.Mutex
	lines map[string][]string
}{lines: map[string][]string{}}

type toyLines struct{ name string }

func (s *toyLines) Write(recs []abi.Record) error {
	toyOut.Lock()
	defer toyOut.Unlock()
	for _, r := range recs {
		toyOut.lines[s.name] = append(toyOut.lines[s.name], string(r.Value))
	}
	return nil
}
func (s *toyLines) Flush() error { return nil }
func (s *toyLines) Close() error { return nil }

const toyJob = `name: toy
parallelism: 2
checkpoint: {interval: 50ms, dir: checkpoints}
operators:
  - uid: count
    source: {type: toy_counter, count: 500, case: upper}
  - uid: keep
    sink: {type: toy_lines, name: %s}
    inputs: [{from: count, partition: rebalance}]
`

// TestToyConnector: the toy source and sink in a job file, validate,
// streamd run and a deployed job's spec.
func TestToyConnector(t *testing.T) {
	toyReset("run")
	dir := t.TempDir()
	t.Chdir(dir)
	must(t, os.WriteFile("job.yaml", []byte(fmt.Sprintf(toyJob, "run")), 0o644))

	code, _, out, errs := invoke(t, "validate", "job.yaml")
	if code != exitOK || !strings.Contains(out, "source toy_counter count=500 case=upper") || !strings.Contains(out, "sink toy_lines name=run") {
		t.Fatalf("validate: exit %d\n%s%s", code, out, errs)
	}

	// The loader checks the toy's fields from its spec, with lines and
	// suggestions, as every connector's.
	must(t, os.WriteFile("bad.yaml", []byte(`name: bad
operators:
  - uid: count
    source: {type: toy_counter, cuont: 5, case: title}
  - uid: keep
    sink: {type: toy_lines}
    inputs: [count]
`), 0o644))
	code, _, out, errs = invoke(t, "validate", "bad.yaml")
	for _, want := range []string{
		`operator "count" (line 4): source.count: missing: a toy_counter counts up to count`,
		`operator "count" (line 4): source.cuont: unknown field (did you mean "count"?)`,
		`operator "count" (line 4): source.case: unknown case "title" (want lower or upper)`,
		`operator "keep" (line 6): sink.name: missing: name the toy_lines sink`,
	} {
		if code != exitFailed || !strings.Contains(errs, want) {
			t.Errorf("validate bad.yaml: exit %d, stderr lacks %q:\n%s%s", code, want, out, errs)
		}
	}

	// toy.suffix is a setting of the toy connector: a flag of streamd run.
	code, _, out, errs = invoke(t, "run", "--progress", "off", "--toy-suffix", "!", "job.yaml")
	if code != exitOK {
		t.Fatalf("run: exit %d\n%s%s", code, out, errs)
	}
	got := toyValues("run")
	var want []string
	for n := range 500 {
		want = append(want, fmt.Sprintf("N-%d!", n))
	}
	slices.Sort(want)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("toy_lines got %d values, want N-0!..N-499! once each", len(got))
	}
	if cps, _ := filepath.Glob(filepath.Join(dir, "checkpoints", "*")); len(cps) == 0 {
		t.Errorf("no checkpoint in %s", filepath.Join(dir, "checkpoints"))
	}

	// Deployed: the spec travels as JSON to the hosts and comes back with
	// the toy's values.
	job, err := jobfile.LoadJob("job.yaml", jobfile.Options{})
	must(t, err)
	spec, err := wire.NewJobSpec(job, "", func(path string) (wire.Artifact, error) {
		return wire.Artifact{}, fmt.Errorf("the toy job has no files, asked for %s", path)
	})
	must(t, err)
	b, err := json.Marshal(spec)
	must(t, err)
	var back wire.JobSpec
	must(t, json.Unmarshal(b, &back))
	g, err := back.Graph(func(wire.Artifact) (string, error) { return "", fmt.Errorf("no artifacts") })
	must(t, err)
	src := g.Vertex("count").Spec.(*jobfile.SourceSpec)
	if c := src.Conf(); src.Type != "toy_counter" || c.Int("count") != 500 || c.String("case") != "upper" || c.String("prefix") != "n-" {
		t.Errorf("deployed source spec %+v (%s)", src, b)
	}
	if s := g.Vertex("keep").Spec.(*jobfile.SinkSpec); s.Conf().String("name") != "run" {
		t.Errorf("deployed sink spec %+v", s)
	}
}

// toyReset forgets what the toy_lines sinks names kept (a test run again).
func toyReset(names ...string) {
	toyOut.Lock()
	defer toyOut.Unlock()
	for _, n := range names {
		delete(toyOut.lines, n)
	}
}

// toyValues are the values the toy_lines sink name kept, sorted.
func toyValues(name string) []string {
	toyOut.Lock()
	defer toyOut.Unlock()
	got := slices.Clone(toyOut.lines[name])
	slices.Sort(got)
	return got
}

// TestToyConnectorResumes: the toy source's positions go into a savepoint
// and a run resumed from it continues where the first stopped, so the two
// runs together keep every value once.
func TestToyConnectorResumes(t *testing.T) {
	const job = `name: toy
parallelism: 2
checkpoint: {interval: 50ms, dir: checkpoints}
operators:
  - uid: count
    source: {type: toy_counter, count: 400, delay: %s}
  - uid: keep
    sink: {type: toy_lines, name: %s}
    inputs: [count]
`
	toyReset("first", "second")
	base, id, stderr, exit := startRun(t, fmt.Sprintf(job, "5ms", "first"))
	deadline := time.Now().Add(30 * time.Second)
	for len(toyValues("first")) < 20 {
		if time.Now().After(deadline) {
			t.Fatalf("the toy source wrote %d values in 30s: %s", len(toyValues("first")), stderr)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The REST API (and status --json) describe it as validate does.
	var d webapi.JobDetail
	if code, b := request(t, http.MethodGet, base+"/jobs/"+id, "", &d); code != 200 || len(d.Vertices) != 2 ||
		d.Vertices[0].Connector != "source toy_counter count=400 delay=5ms" || d.Vertices[1].Connector != "sink toy_lines name=first" {
		t.Errorf("GET /jobs/%s: %d %s", id, code, b)
	}
	var sp webapi.SavepointReply
	if code, b := request(t, http.MethodPost, base+"/jobs/"+id+"/stop", `{"drain": false}`, &sp); code != 200 || sp.State != "stopped" {
		t.Fatalf("stop: %d %s", code, b)
	}
	if code := <-exit; code != exitOK {
		t.Fatalf("first run: exit %d: %s", code, stderr)
	}
	first := toyValues("first")
	if len(first) >= 400 {
		t.Fatalf("the first run read everything (%d) before it was stopped", len(first))
	}
	must(t, os.WriteFile("job.yaml", []byte(fmt.Sprintf(job, "0s", "second")), 0o644))
	if code, _, out, errs := invoke(t, "run", "--progress", "off", "--from", sp.Location, "job.yaml"); code != exitOK {
		t.Fatalf("resumed run: exit %d\n%s%s", code, out, errs)
	}
	all := append(first, toyValues("second")...)
	slices.Sort(all)
	var want []string
	for n := range 400 {
		want = append(want, fmt.Sprintf("n-%d", n))
	}
	slices.Sort(want)
	if !reflect.DeepEqual(all, want) {
		t.Errorf("first run %d values + resumed run %d: want n-0..n-399 once each", len(first), len(toyValues("second")))
	}
}
