package jobfile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/control"
)

// emptyModule is the smallest valid WebAssembly module: the header only.
var emptyModule = []byte{0, 'a', 's', 'm', 1, 0, 0, 0}

// fixture writes a job file and the files it refers to into a new directory.
func fixture(t *testing.T, job string) string {
	t.Helper()
	dir := t.TempDir()
	must(t, os.WriteFile(filepath.Join(dir, "input.txt"), []byte("a b c\n"), 0o644))
	must(t, os.MkdirAll(filepath.Join(dir, "mods"), 0o755))
	must(t, os.WriteFile(filepath.Join(dir, "mods", "count.wasm"), emptyModule, 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "mods", "notwasm.wasm"), []byte("hello"), 0o644))
	path := filepath.Join(dir, "wordcount.yaml")
	// The cases below append to a common head with a raw string that starts
	// on a new line; drop that blank line so line numbers count naturally.
	job = strings.ReplaceAll(strings.TrimLeft(job, "\n"), "\n\n", "\n")
	must(t, os.WriteFile(path, []byte(job), 0o644))
	return path
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

const wordcount = `
name: wordcount
parallelism: 2                  # default for operators
checkpoint: {interval: 5s, dir: ./checkpoints}
operators:
  - uid: lines
    source: {type: file, path: input.txt}
  - uid: count
    wasm: mods/count.wasm
    config: {min_length: 3, words: [a, b], nested: {x: 1}, empty: ~, quoted: "007", flag: true}
    inputs: [{from: lines, partition: hash}]
  - uid: out
    sink: {type: file, path: out/}
    inputs: [{from: count}]
`

func TestLoadWordcount(t *testing.T) {
	path := fixture(t, wordcount)
	dir := filepath.Dir(path)
	job, err := LoadJob(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	g := job.Graph
	if g.Name != "wordcount" || len(g.Vertices) != 3 {
		t.Fatalf("graph %q with %d vertices", g.Name, len(g.Vertices))
	}
	lines, count, out := g.Vertex("lines"), g.Vertex("count"), g.Vertex("out")
	if lines.Kind != control.KindSource || count.Kind != control.KindOperator || out.Kind != control.KindSink {
		t.Errorf("kinds %q %q %q", lines.Kind, count.Kind, out.Kind)
	}
	for _, v := range g.Vertices {
		if v.Parallelism != 2 || v.MaxParallelism != 128 {
			t.Errorf("%s: parallelism %d max %d, want 2 and 128", v.UID, v.Parallelism, v.MaxParallelism)
		}
	}
	if src := lines.Spec.(*SourceSpec); src.Type != "file" || src.Path != filepath.Join(dir, "input.txt") {
		t.Errorf("source spec %+v", src)
	}
	ws := count.Spec.(*WasmSpec)
	if ws.Path != filepath.Join(dir, "mods", "count.wasm") {
		t.Errorf("wasm path %q", ws.Path)
	}
	wantCfg := map[string]string{"min_length": "3", "words": `["a","b"]`, "nested": `{"x":1}`, "empty": "", "quoted": "007", "flag": "true"}
	if !reflect.DeepEqual(ws.Config, wantCfg) {
		t.Errorf("config = %v, want %v", ws.Config, wantCfg)
	}
	if e := count.Inputs[0]; e.From != "lines" || e.Partition != control.Hash || e.To != "count" || e.Input != 0 {
		t.Errorf("count input %+v", e)
	}
	if e := out.Inputs[0]; e.Partition != control.Forward {
		t.Errorf("out input partition %q, want forward by default", e.Partition)
	}
	if sink := out.Spec.(*SinkSpec); sink.Type != "file" || sink.Path != filepath.Join(dir, "out") || sink.Format != "value" {
		t.Errorf("sink spec %+v", sink)
	}
	want := &CheckpointSettings{Interval: 5 * time.Second, Dir: filepath.Join(dir, "checkpoints"), Retain: 1, Timeout: 10 * time.Minute,
		TolerableFailures: DefaultTolerableFailures, MaxConcurrent: 1, FinalImmediately: true, Mode: ModeAligned}
	if !reflect.DeepEqual(job.Checkpoint, want) {
		t.Errorf("checkpoint %+v, want %+v", job.Checkpoint, want)
	}
	if job.Restart != DefaultRestart(RestartExponentialDelay) || job.Path != path {
		t.Errorf("restart %+v path %q", job.Restart, job.Path)
	}
	if _, err := os.Stat(filepath.Join(dir, "out")); !os.IsNotExist(err) {
		t.Errorf("loading created the output directory (or: %v)", err)
	}

	g2, err := Load(path)
	if err != nil || g2.Name != "wordcount" {
		t.Fatalf("Load: %v", err)
	}
}

func TestParallelismOverride(t *testing.T) {
	path := fixture(t, `
name: p
parallelism: 2
operators:
  - uid: gen
    parallelism: 1
    source: {type: generator, count: 10}
  - uid: op
    wasm: mods/count.wasm
    inputs: [{from: gen, partition: rebalance}]
  - uid: out
    sink: {type: discard}
    inputs: [op]
`)
	for _, tt := range []struct{ override, gen, op, out int }{{0, 1, 2, 2}, {4, 1, 4, 4}, {1, 1, 1, 1}} {
		job, err := LoadJob(path, Options{Parallelism: tt.override})
		if err != nil {
			t.Fatal(err)
		}
		g := job.Graph
		if got := [3]int{g.Vertex("gen").Parallelism, g.Vertex("op").Parallelism, g.Vertex("out").Parallelism}; got != [3]int{tt.gen, tt.op, tt.out} {
			t.Errorf("override %d: parallelisms %v, want %d %d %d", tt.override, got, tt.gen, tt.op, tt.out)
		}
	}
	_, err := LoadJob(path, Options{Parallelism: 500})
	if err == nil || !strings.Contains(err.Error(), "parallelism: the override 500 is above max_parallelism 128") {
		t.Fatalf("override 500: %v", err)
	}
}

// TestMinParallelism: the job's min_parallelism holds for the operators that
// set none, up to their own parallelism; an operator's own replaces it; none
// declared is 0 (runs at 1 and up).
func TestMinParallelism(t *testing.T) {
	path := fixture(t, `
name: p
parallelism: 4
min_parallelism: 2
operators:
  - uid: gen
    source: {type: generator, count: 10}
  - uid: op
    min_parallelism: 3
    wasm: mods/count.wasm
    inputs: [{from: gen, partition: rebalance}]
  - uid: out
    parallelism: 1
    sink: {type: discard}
    inputs: [{from: op, partition: rebalance}]
`)
	job, err := LoadJob(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	g := job.Graph
	if got := [3]int{g.Vertex("gen").MinParallelism, g.Vertex("op").MinParallelism, g.Vertex("out").MinParallelism}; got != [3]int{2, 3, 1} {
		t.Errorf("min parallelisms %v, want [2 3 1]", got)
	}
	if slots, declared, least := control.AdaptiveSlots(control.VertexBounds(g), 2); slots != 0 || declared != 4 || least != 3 {
		t.Errorf("on 2 slots: %d slots (declared %d, least %d), want 0 (4, 3)", slots, declared, least)
	}
	job, err = LoadJob(fixture(t, "name: q\nparallelism: 3\noperators:\n  - uid: gen\n    source: {type: generator, count: 1}\n"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if m := job.Graph.Vertex("gen").MinParallelism; m != 0 {
		t.Errorf("none declared: %d, want 0", m)
	}
}

func TestGeneratorAndSinkFields(t *testing.T) {
	path := fixture(t, `
name: gen
operators:
  - uid: gen
    source: {type: generator, count: 1000, rate: 50.5, key: "k{k}", value: "", keys: 7, value_size: 16, start_ts: 1000, ts_step: 10, watermark_lag: 250ms}
  - uid: out
    sink: {type: stdout, format: kv}
    inputs:
      - gen
`)
	g, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	want := &SourceSpec{Type: "generator", Count: 1000, Rate: 50.5, KeyPattern: "k{k}", ValuePattern: "", Keys: 7, ValueSize: 16, StartTS: 1000, TSStep: 10, WatermarkLag: 250 * time.Millisecond}
	if got := g.Vertex("gen").Spec.(*SourceSpec); !reflect.DeepEqual(got, want) {
		t.Errorf("generator = %+v\nwant %+v", got, want)
	}
	if got := g.Vertex("out").Spec.(*SinkSpec); got.Type != "stdout" || got.Format != "kv" {
		t.Errorf("sink = %+v", got)
	}
	if g.Vertex("gen").Parallelism != 1 {
		t.Errorf("default parallelism %d, want 1", g.Vertex("gen").Parallelism)
	}
}

func TestDefaults(t *testing.T) {
	path := fixture(t, `
operators:
  - uid: gen
    source: {type: generator, count: 5}
  - uid: out
    sink: {type: discard}
    inputs: [gen]
`)
	job, err := LoadJob(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if job.Graph.Name != "wordcount" {
		t.Errorf("name %q: want the file's base name", job.Graph.Name)
	}
	if job.Checkpoint != nil || job.Restart.Strategy != RestartNone {
		t.Errorf("checkpoint %+v restart %+v: want none", job.Checkpoint, job.Restart)
	}
	want := &SourceSpec{Type: "generator", Count: 5, KeyPattern: "key-{k}", ValuePattern: "value-{n}", Keys: 100, TSStep: 1}
	if got := job.Graph.Vertex("gen").Spec.(*SourceSpec); !reflect.DeepEqual(got, want) {
		t.Errorf("generator defaults %+v, want %+v", got, want)
	}
	if _, err := Parse([]byte("operators: []\n"), t.TempDir()); err == nil || !strings.Contains(err.Error(), "name: missing") {
		t.Errorf("Parse without a name: %v", err)
	}
}

// TestInvalid checks that each broken job file is rejected with every
// expected problem, rendered with the file, operator, line and field.
func TestInvalid(t *testing.T) {
	const head = "name: bad\noperators:\n  - uid: lines\n    source: {type: file, path: input.txt}\n"
	tests := []struct {
		name string
		job  string
		want []string
	}{
		{"unknown input", head + `
  - uid: count
    wasm: mods/count.wasm
    inputs: [{from: lnes, partition: hash}]
`, []string{`jobfile: wordcount.yaml: operator "count" (line 7): inputs[0].from: unknown operator "lnes"`}},
		{"cycle", head + `
  - uid: a
    wasm: mods/count.wasm
    inputs: [lines, b]
  - uid: b
    wasm: mods/count.wasm
    inputs: [a]
`, []string{`operator "a" (line 7): inputs[1].from: cycle: a -> b -> a`}},
		{"duplicate uid", head + `
  - uid: lines
    sink: {type: stdout}
    inputs: [lines]
`, []string{`operator "lines" (line 5): uid: duplicate uid "lines", first used on line 3`}},
		{"forward between parallelisms", head + `
  - uid: out
    parallelism: 3
    sink: {type: stdout}
    inputs: [{from: lines}]
`, []string{`operator "out" (line 8): inputs[0].partition: forward from "lines" (parallelism 1) to "out" (parallelism 3) needs equal parallelism; use rebalance, hash or broadcast`}},
		{"parallelism zero", head + `
  - uid: out
    parallelism: 0
    sink: {type: stdout}
    inputs: [{from: lines, partition: rebalance}]
`, []string{`operator "out" (line 6): parallelism: must be at least 1, got 0`}},
		{"parallelism above max", `name: bad
max_parallelism: 8
parallelism: 9
operators:
  - uid: g
    source: {type: generator, count: 1}
  - uid: o
    parallelism: 20
    sink: {type: discard}
    inputs: [{from: g, partition: rebalance}]
`, []string{`line 3: parallelism: 9 is above max_parallelism 8`, `operator "o" (line 8): parallelism: 20 is above max_parallelism 8`}},
		{"min parallelism out of range", `name: bad
parallelism: 2
min_parallelism: 3
operators:
  - uid: g
    min_parallelism: 0
    source: {type: generator, count: 1}
  - uid: o
    parallelism: 4
    min_parallelism: 5
    sink: {type: discard}
    inputs: [{from: g, partition: rebalance}]
`, []string{`line 3: min_parallelism: 3 is above the job's parallelism 2`, `operator "g" (line 6): min_parallelism: must be at least 1, got 0`,
			`operator "o" (line 10): min_parallelism: 5 is above the operator's parallelism 4`}},
		{"missing module", head + `
  - uid: count
    wasm: mods/nope.wasm
    inputs: [lines]
`, []string{`operator "count" (line 6): wasm: cannot read module `, `mods/nope.wasm: no such file or directory`}},
		{"not a module", head + `
  - uid: count
    wasm: mods/notwasm.wasm
    inputs: [lines]
`, []string{`operator "count" (line 6): wasm: `, `notwasm.wasm is not a WebAssembly module`}},
		{"unknown source type", `name: bad
operators:
  - uid: k
    source: {type: kafka, path: x}
`, []string{`operator "k" (line 4): source.type: unknown source type "kafka" (want file, generator, nats or nexmark)`}},
		{"unknown sink type", head + `
  - uid: out
    sink: {type: s3}
    inputs: [lines]
`, []string{`operator "out" (line 6): sink.type: unknown sink type "s3" (want file, stdout, discard, nats)`}},
		{"typo in field", head + `
  - uid: out
    snk: {type: stdout}
    inputs: [lines]
`, []string{`operator "out" (line 6): snk: unknown field (did you mean "sink"?)`, `operator "out" (line 5): needs one of source, sink or wasm`}},
		{"typo at top level", "nmae: x\n" + head[len("name: bad\n"):], []string{`line 1: nmae: unknown field (did you mean "name"?)`}},
		{"two kinds", head + `
  - uid: both
    sink: {type: stdout}
    wasm: mods/count.wasm
    inputs: [lines]
`, []string{`operator "both" (line 7): wasm: an operator has exactly one of source, sink or wasm; this one also has sink`}},
		{"missing uid", head + `
  - sink: {type: stdout}
    inputs: [lines]
`, []string{`line 5: operators[1].uid: missing: every operator needs a stable uid`}},
		{"missing input file", `name: bad
operators:
  - uid: lines
    source: {type: file, path: nothere.txt}
`, []string{`operator "lines" (line 4): source.path: cannot read input file `, `nothere.txt: no such file or directory`}},
		{"source field of another type", `name: bad
operators:
  - uid: lines
    source: {type: file, path: input.txt, count: 3}
`, []string{`operator "lines" (line 4): source.count: not a field of a file source`}},
		{"generator without count", `name: bad
operators:
  - uid: g
    source:
      type: generator
      keys: 0
`, []string{`operator "g" (line 5): source.count: a generator needs count`, `operator "g" (line 6): source.keys: must be at least 1, got 0`}},
		{"bad types", `name: bad
parallelism: two
checkpoint: {interval: 5, retain: 0}
operators:
  - uid: g
    source: {type: generator, count: 1, watermark_lag: soon}
`, []string{
			`line 2: parallelism: want an integer, got "two"`,
			`line 3: checkpoint.interval: want a duration like 500ms, 5s or 1m, got "5"`,
			`line 3: checkpoint.retain: must be at least 1, got 0`,
			`operator "g" (line 6): source.watermark_lag: want a duration like 500ms, 5s or 1m, or an integer number of milliseconds, got "soon"`,
		}},
		{"sink without input and source with input", `name: bad
operators:
  - uid: g
    source: {type: generator, count: 1}
    inputs: [o]
  - uid: o
    sink: {type: discard}
`, []string{`operator "g" (line 5): inputs: a source takes no inputs`, `operator "o" (line 6): inputs: a sink needs at least one input`}},
		{"config on a sink", head + `
  - uid: out
    sink: {type: stdout}
    config: {a: 1}
    inputs: [lines]
`, []string{`operator "out" (line 7): config: only a wasm operator takes config`}},
		{"unknown partition", head + `
  - uid: out
    sink: {type: stdout}
    inputs: [{from: lines, partition: hsh}]
`, []string{`operator "out" (line 7): inputs[0].partition: unknown partitioning "hsh"`}},
		{"file sink on a file", head + `
  - uid: out
    sink: {type: file, path: input.txt}
    inputs: [lines]
`, []string{`operator "out" (line 6): sink.path: `, `input.txt is a file; a file sink writes into a directory`}},
		{"yaml syntax", "name: bad\noperators:\n  - uid: [\n", []string{`jobfile: wordcount.yaml: line `, `YAML: `}},
		{"unclosed flow mapping", "name: x\noperators:\n  - uid: gen\n    source: {type: generator, count: 10\n  - uid: out\n    sink: {type: stdout}\n",
			[]string{`jobfile: wordcount.yaml: line 4: YAML: did not find expected ',' or '}' (the '{' on this line is not closed)`}},
		{"unclosed flow sequence", "name: x\noperators:\n  - uid: out\n    sink: {type: stdout}\n    inputs: [gen\n",
			[]string{`jobfile: wordcount.yaml: line 5: YAML: did not find expected ',' or ']' (the '[' on this line is not closed)`}},
		{"bad indentation", "name: x\noperators:\n  - uid: out\n    sink: {type: stdout}\n   inputs: [gen]\n", []string{`jobfile: wordcount.yaml: line 3: YAML: did not find expected '-' indicator (in the list that begins on this line: check the indentation of the lines below)`}},
		{"unclosed flow sequence at the end", "name: bad\noperators: [\n", []string{`jobfile: wordcount.yaml: line 2: YAML: did not find expected node content`}},
		{"mapping value in a scalar", "name: x\noperators: a: b\n", []string{`jobfile: wordcount.yaml: line 2: YAML: mapping values are not allowed in this context`}},
		{"empty", "", []string{`jobfile: wordcount.yaml: the job file is empty`}},
		{"not a mapping", "- a\n- b\n", []string{`line 1: the job file must be a mapping`}},
		{"no operators", "name: x\n", []string{`line 1: operators: missing: a job needs at least one operator`}},
		{"restart", head + "restart: {strategy: forever}\n", []string{`line 5: restart.strategy: unknown strategy "forever" (want none, fixed-delay, failure-rate or exponential-delay)`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := fixture(t, tt.job)
			_, err := LoadJob(path, Options{Filename: "wordcount.yaml"})
			if err == nil {
				t.Fatalf("loaded; want errors %q", tt.want)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("%v does not match ErrInvalid", err)
			}
			var je *Error
			if !errors.As(err, &je) {
				t.Fatalf("%T is not *Error", err)
			}
			msg := err.Error()
			for _, w := range tt.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error lacks %q:\n%s", w, msg)
				}
			}
			for _, line := range strings.Split(msg, "\n") {
				if !strings.HasPrefix(line, "jobfile: wordcount.yaml: ") {
					t.Errorf("line %q lacks the file prefix", line)
				}
			}
			if _, err := os.Stat(filepath.Join(filepath.Dir(path), "out")); !os.IsNotExist(err) {
				t.Errorf("an invalid job created out/")
			}
		})
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "none.yaml"))
	if err == nil || !strings.Contains(err.Error(), "jobfile: open ") || !strings.Contains(err.Error(), "none.yaml: no such file") {
		t.Fatalf("err = %v", err)
	}
}

func TestFilterJob(t *testing.T) {
	dir := t.TempDir()
	mod := filepath.Join(dir, "upper-case.wasm")
	must(t, os.WriteFile(mod, emptyModule, 0o644))
	in := filepath.Join(dir, "in.txt")
	must(t, os.WriteFile(in, []byte("x\n"), 0o644))

	job, err := FilterJob(Filter{Module: mod, Config: map[string]string{"a": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	g := job.Graph
	if g.Name != "upper-case" || len(g.Vertices) != 3 || g.Vertices[1].UID != "upper-case" {
		t.Fatalf("graph %q %v", g.Name, g.Vertices)
	}
	if s := g.Vertex("source").Spec.(*SourceSpec); s.Type != "file" || s.Path != "-" {
		t.Errorf("default source %+v, want stdin", s)
	}
	if s := g.Vertex("sink").Spec.(*SinkSpec); s.Type != "stdout" {
		t.Errorf("default sink %+v", s)
	}
	if ws := g.Vertex("upper-case").Spec.(*WasmSpec); ws.Path != mod || ws.Config["a"] != "1" {
		t.Errorf("wasm spec %+v", ws)
	}

	job, err = FilterJob(Filter{Module: mod, Source: "file:" + in, Sink: "file:" + filepath.Join(dir, "out"), Parallelism: 4})
	if err != nil {
		t.Fatal(err)
	}
	g = job.Graph
	if src, op, sink := g.Vertex("source"), g.Vertex("upper-case"), g.Vertex("sink"); src.Parallelism != 1 || op.Parallelism != 4 || sink.Parallelism != 4 ||
		op.Inputs[0].Partition != control.Rebalance || sink.Inputs[0].Partition != control.Forward {
		t.Errorf("parallel filter: %d %d %d, edges %q %q", src.Parallelism, op.Parallelism, sink.Parallelism, op.Inputs[0].Partition, sink.Inputs[0].Partition)
	}
	job, err = FilterJob(Filter{Module: mod, Source: "generator:50", Sink: "discard", Parallelism: 2})
	if err != nil {
		t.Fatal(err)
	}
	if s := job.Graph.Vertex("source"); s.Parallelism != 2 || s.Spec.(*SourceSpec).Count != 50 {
		t.Errorf("generator source %+v", s)
	}

	// A transform: a nats source, the module and a nats sink per output,
	// all at the parallelism, checkpointed.
	in1 := &SourceSpec{Type: "nats", Stream: "ORDERS", Subject: "orders.>", Start: "seq:7"}
	out1 := &SinkSpec{Type: "nats", Subject: "a.b"}
	ck := NewCheckpointSettings(time.Second, "")
	job, err = FilterJob(Filter{Module: mod, Input: in1, Outputs: []*SinkSpec{out1, {Type: "nats", Subject: "c"}}, Parallelism: 3, Name: "tr", Checkpoint: ck})
	if err != nil {
		t.Fatal(err)
	}
	g = job.Graph
	var uids []string
	for _, v := range g.Vertices {
		uids = append(uids, v.UID)
		if v.Parallelism != 3 {
			t.Errorf("transform vertex %s: parallelism %d, want 3", v.UID, v.Parallelism)
		}
	}
	if g.Name != "tr" || strings.Join(uids, " ") != "source upper-case sink-a_b sink-c" || g.Vertex("source").Spec.(*SourceSpec).Start != "seq:7" ||
		job.Checkpoint != ck || job.Restart.Strategy != RestartExponentialDelay {
		t.Errorf("transform: name %q, vertices %v, checkpoint %+v, restart %+v", g.Name, uids, job.Checkpoint, job.Restart)
	}
	if in := g.Vertex("upper-case").Inputs; len(in) != 1 || in[0].Partition != control.Hash {
		t.Errorf("transform: the module's input %+v, want hash-partitioned (keyed state at any parallelism)", in)
	}

	for _, tt := range []struct {
		f    Filter
		want string
	}{
		{Filter{Module: filepath.Join(dir, "none.wasm")}, "module: cannot read module"},
		{Filter{Module: in}, "is not a WebAssembly module"},
		{Filter{Module: mod, Source: "kafka:x"}, `--source: unknown source "kafka:x"`},
		{Filter{Module: mod, Source: "generator:many"}, "--source: generator needs a record count"},
		{Filter{Module: mod, Source: "file:" + filepath.Join(dir, "nope")}, "--source: cannot read input file"},
		{Filter{Module: mod, Sink: "s3:bucket"}, `--sink: unknown sink "s3:bucket"`},
		{Filter{Module: mod, Sink: "file:" + in}, "a file sink writes into a directory"},
		{Filter{Module: mod, Parallelism: -1}, "--parallelism: must be between 1 and 128"},
		{Filter{Module: mod, Source: "nats:orders"}, `--source: "nats:orders": a module reads NATS as a transform: streamd deploy MODULE.wasm --input nats:SUBJECT`},
		{Filter{Module: mod, Source: "generator:5", Sink: "nats:out"}, `--sink: "nats:out": a module writes to NATS as a transform`},
		{Filter{Module: mod, Input: in1, Outputs: []*SinkSpec{out1, out1}}, "--output: nats:a.b given twice"},
		{Filter{Module: mod, Input: in1, Outputs: []*SinkSpec{{Type: "nats", Subject: "orders.x"}}}, "--output: nats:orders.x is also read by the input orders.>"},
		{Filter{Module: mod, Input: in1, Outputs: []*SinkSpec{{Type: "nats", Subject: "a.*"}}}, `--output: "a.*" has a wildcard`},
		{Filter{Module: mod, Input: &SourceSpec{Type: "nats", Stream: "S", Start: "later"}}, `--start: "later": want first, new, seq:N or time:RFC3339`},
		{Filter{Module: mod, Input: in1, Source: "generator:5"}, `--input: a transform reads its input; --source "generator:5" is a second source`},
	} {
		if _, err := FilterJob(tt.f); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%+v: err %v, want %q", tt.f, err, tt.want)
		}
	}
}

func TestNATSFields(t *testing.T) {
	path := fixture(t, `
name: natsjob
operators:
  - uid: in
    source: {type: nats, url: "nats://a:4222,nats://b:4222", stream: ORDERS, subject: "orders.*", bounded: true, key_from: subject, watermark_lag: 2s}
  - uid: in2
    source: {type: nats, stream: EVENTS}
  - uid: out
    sink: {type: nats, subject: results.upper}
    inputs: [in, in2]
  - uid: out2
    sink: {type: nats, url: "tls://nats.example:4443", subject: results.copy, commit_subject: commits.copy}
    inputs: [in]
`)
	g, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	want := &SourceSpec{Type: "nats", URL: "nats://a:4222,nats://b:4222", Stream: "ORDERS", Subject: "orders.*", Bounded: true, KeyFrom: "subject",
		WatermarkLag: 2 * time.Second, KeyPattern: "key-{k}", ValuePattern: "value-{n}", Keys: 100, TSStep: 1}
	if got := g.Vertex("in").Spec.(*SourceSpec); !reflect.DeepEqual(got, want) {
		t.Errorf("source = %+v\nwant %+v", got, want)
	}
	if got := g.Vertex("in2").Spec.(*SourceSpec); got.URL != "" || got.Stream != "EVENTS" || got.Bounded || got.KeyFrom != "" || got.Subject != "" || got.Start != "" {
		t.Errorf("source with defaults = %+v", got)
	}
	if got := g.Vertex("out").Spec.(*SinkSpec); got.Type != "nats" || got.URL != "" || got.Subject != "results.upper" {
		t.Errorf("sink = %+v", got)
	}
	if got := g.Vertex("out2").Spec.(*SinkSpec); got.URL != "tls://nats.example:4443" || got.Subject != "results.copy" || got.CommitSubject != "commits.copy" {
		t.Errorf("sink with url = %+v", got)
	}
}

// TestNATSStart: the start positions a nats source takes, as the job file
// spells them and as they are kept (canonical).
func TestNATSStart(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"first", "first"}, {"new", "new"}, {`"seq:42"`, "seq:42"},
		{`"time:2025-01-02T15:04:05+01:00"`, "time:2025-01-02T15:04:05+01:00"},
		{`"time:2025-01-02T15:04:05.5Z"`, "time:2025-01-02T15:04:05.5Z"},
	} {
		path := fixture(t, "name: s\noperators:\n  - uid: in\n    source: {type: nats, stream: S, start: "+tt.in+"}\n  - uid: out\n    sink: {type: discard}\n    inputs: [in]\n")
		g, err := Load(path)
		if err != nil {
			t.Fatalf("start %s: %v", tt.in, err)
		}
		if got := g.Vertex("in").Spec.(*SourceSpec).Start; got != tt.want {
			t.Errorf("start %s: kept as %q, want %q", tt.in, got, tt.want)
		}
		st, err := ParseNATSStart(tt.want)
		if err != nil || st.String() != tt.want {
			t.Errorf("ParseNATSStart(%q) = %+v, %v; want it to read back as itself", tt.want, st, err)
		}
	}
	if st, err := ParseNATSStart(""); err != nil || st.Kind != StartFirst {
		t.Errorf(`ParseNATSStart("") = %+v, %v; want first`, st, err)
	}
}

func TestNATSInvalid(t *testing.T) {
	const src = "name: bad\noperators:\n  - uid: in\n"
	const snk = "name: bad\noperators:\n  - uid: g\n    source: {type: generator, count: 1}\n  - uid: out\n    inputs: [g]\n"
	tests := []struct {
		name, job string
		want      []string
	}{
		{"no stream", src + "    source: {type: nats}\n", []string{`operator "in" (line 4): source.stream: missing: a nats source reads the JetStream stream named by stream`}},
		{"bad stream", src + "    source: {type: nats, stream: a.b}\n", []string{`operator "in" (line 4): source.stream: "a.b" is not a stream name`}},
		{"bad url", src + "    source: {type: nats, stream: S, url: \"http://x:4222\"}\n", []string{`operator "in" (line 4): source.url: server URL "http://x:4222": scheme "http", want nats://, tls://, ws:// or wss://`}},
		{"empty url", src + "    source: {type: nats, stream: S, url: \"\"}\n", []string{`operator "in" (line 4): source.url: empty: leave url out to use the configured nats.url`}},
		{"key_from", src + "    source: {type: nats, stream: S, key_from: value}\n", []string{`operator "in" (line 4): source.key_from: unknown key source "value" (want header or subject)`}},
		{"bounded", src + "    source: {type: nats, stream: S, bounded: yes please}\n", []string{`operator "in" (line 4): source.bounded: want true or false, got "yes please"`}},
		{"subject", src + "    source: {type: nats, stream: S, subject: \"a.>.b\"}\n", []string{`operator "in" (line 4): source.subject: "a.>.b" is not a NATS subject`}},
		{"file field", src + "    source: {type: nats, stream: S, path: x}\n", []string{`operator "in" (line 4): source.path: not a field of a nats source`}},
		{"nats field on generator", src + "    source: {type: generator, count: 1, stream: S}\n", []string{`operator "in" (line 4): source.stream: not a field of a generator source`}},
		{"lag", src + "    source: {type: nats, stream: S, watermark_lag: -1s}\n", []string{`operator "in" (line 4): source.watermark_lag: must not be negative, got -1s`}},
		{"start unknown", src + "    source: {type: nats, stream: S, start: last}\n", []string{`operator "in" (line 4): source.start: "last": want first, new, seq:N or time:RFC3339`}},
		{"start seq 0", src + "    source: {type: nats, stream: S, start: \"seq:0\"}\n", []string{`operator "in" (line 4): source.start: "seq:0": seq:N needs a stream sequence N of at least 1`}},
		{"start seq word", src + "    source: {type: nats, stream: S, start: \"seq:ten\"}\n", []string{`source.start: "seq:ten": seq:N needs a stream sequence N of at least 1`}},
		{"start bad time", src + "    source: {type: nats, stream: S, start: \"time:yesterday\"}\n", []string{`source.start: "time:yesterday": time:T needs an RFC 3339 time T like 2025-01-02T15:04:05Z`}},
		{"start bare time", src + "    source: {type: nats, stream: S, start: 2025-01-02T15:04:05Z}\n", []string{`source.start: "2025-01-02T15:04:05Z": want first, new, seq:N or time:RFC3339`}},
		{"start empty", src + "    source: {type: nats, stream: S, start: \"\"}\n", []string{`source.start: empty: want first, new, seq:N or time:RFC3339 (leave start out for first)`}},
		{"start list", src + "    source: {type: nats, stream: S, start: [first]}\n", []string{`source.start: want a string`}},
		{"start on generator", src + "    source: {type: generator, count: 1, start: first}\n", []string{`operator "in" (line 4): source.start: not a field of a generator source`}},
		{"sink no subject", snk + "    sink: {type: nats}\n", []string{`operator "out" (line 7): sink.subject: missing: a nats sink publishes to subject`}},
		{"sink wildcard", snk + "    sink: {type: nats, subject: \"out.*\"}\n", []string{`operator "out" (line 7): sink.subject: "out.*" has a wildcard; a sink publishes to one subject`}},
		{"sink commit wildcard", snk + "    sink: {type: nats, subject: out, commit_subject: \"c.>\"}\n", []string{`operator "out" (line 7): sink.commit_subject: "c.>" has a wildcard; a sink publishes to one subject`}},
		{"sink path", snk + "    sink: {type: nats, subject: out, path: x/, format: kv}\n", []string{`operator "out" (line 7): sink.path: not a field of a nats sink`, `operator "out" (line 7): sink.format: not a field of a nats sink`}},
		{"sink url", snk + "    sink: {type: nats, subject: out, url: \"nats://\"}\n", []string{`operator "out" (line 7): sink.url: server URL "nats://": no host`}},
		{"file sink subject", snk + "    sink: {type: file, path: out/, subject: x}\n", []string{`operator "out" (line 7): sink.subject: not a field of a file sink`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := fixture(t, tt.job)
			_, err := LoadJob(path, Options{Filename: "wordcount.yaml"})
			if err == nil {
				t.Fatalf("loaded; want errors %q", tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
		})
	}
}

// TestWatermarkLagUnits: watermark_lag takes a duration or, like start_ts
// and ts_step, a plain integer of milliseconds.
func TestWatermarkLagUnits(t *testing.T) {
	const job = "name: lag\noperators:\n  - uid: in\n    source: {type: %s, watermark_lag: %s}\n  - uid: out\n    sink: {type: stdout}\n    inputs: [in]\n"
	for _, tt := range []struct {
		src, lag string
		want     time.Duration
		err      string
	}{
		{"generator, count: 1", "50", 50 * time.Millisecond, ""},
		{"generator, count: 1", "0", 0, ""},
		{"generator, count: 1", "250ms", 250 * time.Millisecond, ""},
		{"generator, count: 1", "1m", time.Minute, ""},
		{"nats, stream: S", "2000", 2 * time.Second, ""},
		{"nats, stream: S", "-5", 0, `operator "in" (line 4): source.watermark_lag: must not be negative, got -5ms`},
		{"generator, count: 1", "1.5", 0, `operator "in" (line 4): source.watermark_lag: want a duration like 500ms, 5s or 1m, or an integer number of milliseconds, got "1.5"`},
		{"generator, count: 1", `"50"`, 0, `operator "in" (line 4): source.watermark_lag: want a duration like 500ms, 5s or 1m, or an integer number of milliseconds, got "50"`},
		{"generator, count: 1", "99999999999999999", 0, `operator "in" (line 4): source.watermark_lag: milliseconds out of range, got "99999999999999999"`},
	} {
		t.Run(tt.src+"/"+tt.lag, func(t *testing.T) {
			g, err := Load(fixture(t, fmt.Sprintf(job, tt.src, tt.lag)))
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("error %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := g.Vertex("in").Spec.(*SourceSpec).WatermarkLag; got != tt.want {
				t.Fatalf("watermark_lag %s = %v, want %v", tt.lag, got, tt.want)
			}
		})
	}
}

// TestCheckpointSettings: every checkpoint field the coordinator supports,
// with their defaults and their errors.
func TestCheckpointSettings(t *testing.T) {
	const ops = `operators:
  - uid: gen
    source: {type: generator, count: 5}
  - uid: out
    sink: {type: discard}
    inputs: [gen]
`
	for _, tt := range []struct {
		name, section string
		want          func(dir string) *CheckpointSettings
		errs          []string
	}{
		{"defaults", "checkpoint: {interval: 1s}\n", func(dir string) *CheckpointSettings {
			return &CheckpointSettings{Interval: time.Second, Dir: filepath.Join(dir, "checkpoints"), Retain: 1, Timeout: 10 * time.Minute,
				TolerableFailures: 3, MaxConcurrent: 1, FinalImmediately: true, Mode: ModeAligned}
		}, nil},
		{"all fields", `checkpoint:
  interval: 250ms
  dir: chk
  retain: 2
  timeout: 30s
  min_pause: 100ms
  tolerable_failures: 0
  max_concurrent: 2
  final_immediately: false
`, func(dir string) *CheckpointSettings {
			return &CheckpointSettings{Interval: 250 * time.Millisecond, Dir: filepath.Join(dir, "chk"), Retain: 2, Timeout: 30 * time.Second,
				MinPause: 100 * time.Millisecond, TolerableFailures: 0, MaxConcurrent: 2, FinalImmediately: false, Mode: ModeAligned}
		}, nil},
		{"unaligned", "checkpoint: {interval: 1s, mode: unaligned}\n", func(dir string) *CheckpointSettings {
			return &CheckpointSettings{Interval: time.Second, Dir: filepath.Join(dir, "checkpoints"), Retain: 1, Timeout: 10 * time.Minute,
				TolerableFailures: 3, MaxConcurrent: 1, FinalImmediately: true, Mode: ModeUnaligned}
		}, nil},
		{"aligned timeout", "checkpoint: {interval: 1s, aligned_timeout: 200ms}\n", func(dir string) *CheckpointSettings {
			return &CheckpointSettings{Interval: time.Second, Dir: filepath.Join(dir, "checkpoints"), Retain: 1, Timeout: 10 * time.Minute,
				TolerableFailures: 3, MaxConcurrent: 1, FinalImmediately: true, Mode: ModeAligned, AlignedTimeout: 200 * time.Millisecond}
		}, nil},
		{"bad mode", "checkpoint: {interval: 1s, mode: sometimes, aligned_timeout: -1s}\n", nil, []string{
			`line 1: checkpoint.mode: "sometimes": want aligned or unaligned`,
			`line 1: checkpoint.aligned_timeout: must not be negative, got -1s`,
		}},
		{"timeout with unaligned", "checkpoint: {interval: 1s, mode: unaligned, aligned_timeout: 1s}\n", nil, []string{
			`line 1: checkpoint.aligned_timeout: only with mode: aligned`,
		}},
		{"unlimited failures", "checkpoint: {interval: 1s, tolerable_failures: -1}\n", func(dir string) *CheckpointSettings {
			return &CheckpointSettings{Interval: time.Second, Dir: filepath.Join(dir, "checkpoints"), Retain: 1, Timeout: 10 * time.Minute,
				TolerableFailures: -1, MaxConcurrent: 1, FinalImmediately: true, Mode: ModeAligned}
		}, nil},
		{"bad values", "checkpoint: {interval: 1s, tolerable_failures: -2, max_concurrent: 0, final_immediately: sometimes, min_pause: -1s, timeout: 0}\n", nil, []string{
			`line 1: checkpoint.tolerable_failures: must be at least 0 (or -1: unlimited), got -2`,
			`line 1: checkpoint.max_concurrent: must be at least 1, got 0`,
			`line 1: checkpoint.final_immediately: want true or false, got "sometimes"`,
			`line 1: checkpoint.min_pause: must not be negative, got -1s`,
			`line 1: checkpoint.timeout: must be positive, got 0s`,
		}},
		{"wrong types", "checkpoint: {interval: 1s, tolerable_failures: many, max_concurrent: 1.5}\n", nil, []string{
			`line 1: checkpoint.tolerable_failures: want an integer, got "many"`,
			`line 1: checkpoint.max_concurrent: want an integer, got "1.5"`,
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := fixture(t, tt.section+ops)
			job, err := LoadJob(path, Options{})
			if checkErrs(t, err, tt.errs) {
				return
			}
			if want := tt.want(filepath.Dir(path)); !reflect.DeepEqual(job.Checkpoint, want) {
				t.Errorf("checkpoint %+v\nwant %+v", job.Checkpoint, want)
			}
		})
	}
}

// TestStateSettings: the state section, its defaults from Options and its
// errors.
func TestStateSettings(t *testing.T) {
	const ops = "operators:\n  - {uid: gen, source: {type: generator, count: 5}}\n  - {uid: out, sink: {type: discard}, inputs: [gen]}\n"
	for _, tt := range []struct {
		name, section string
		opts          Options
		want          StateSettings
		errs          []string
	}{
		{"none", "", Options{}, StateSettings{Backend: StateMemory}, nil},
		{"configured", "", Options{StateBackend: StatePebble}, StateSettings{Backend: StatePebble, CacheMiB: DefaultStateCacheMiB, Incremental: true}, nil},
		{"configured cache", "", Options{StateBackend: StatePebble, StateCacheMiB: 64}, StateSettings{Backend: StatePebble, CacheMiB: 64, Incremental: true}, nil},
		{"memory", "state: {backend: memory}\n", Options{StateBackend: StatePebble}, StateSettings{Backend: StateMemory}, nil},
		{"pebble", "state: {backend: pebble}\n", Options{StateCacheMiB: 64}, StateSettings{Backend: StatePebble, CacheMiB: DefaultStateCacheMiB, Incremental: true}, nil},
		{"pebble cache", "state: {backend: pebble, cache_mib: 32}\n", Options{}, StateSettings{Backend: StatePebble, CacheMiB: 32, Incremental: true}, nil},
		{"pebble full", "state: {backend: pebble, incremental: false}\n", Options{}, StateSettings{Backend: StatePebble, CacheMiB: DefaultStateCacheMiB}, nil},
		{"incremental with memory", "state: {backend: memory, incremental: true}\n", Options{}, StateSettings{}, []string{
			`line 1: state.incremental: only with backend: pebble`,
		}},
		{"incremental type", "state: {backend: pebble, incremental: yes please}\n", Options{}, StateSettings{}, []string{
			`line 1: state.incremental: want true or false`,
		}},
		{"bad backend", "state: {backend: rocksdb}\n", Options{}, StateSettings{}, []string{
			`line 1: state.backend: "rocksdb": want memory or pebble`,
		}},
		{"no backend", "state: {cache_mib: 8}\n", Options{}, StateSettings{}, []string{
			`line 1: state.backend: missing: memory or pebble`,
		}},
		{"cache with memory", "state: {backend: memory, cache_mib: 8}\n", Options{}, StateSettings{}, []string{
			`line 1: state.cache_mib: only with backend: pebble`,
		}},
		{"bad cache", "state: {backend: pebble, cache_mib: 0}\n", Options{}, StateSettings{}, []string{
			`line 1: state.cache_mib: must be between 1 and 1048576, got 0`,
		}},
		{"cache type", "state: {backend: pebble, cache_mib: lots, extra: 1}\n", Options{}, StateSettings{}, []string{
			`line 1: state.cache_mib: want an integer, got "lots"`,
			`line 1: state.extra: unknown field`,
		}},
		{"not a mapping", "state: pebble\n", Options{}, StateSettings{}, []string{
			`line 1: state: want a mapping like {backend: pebble, cache_mib: 256}`,
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			job, err := LoadJob(fixture(t, tt.section+ops), tt.opts)
			if checkErrs(t, err, tt.errs) {
				return
			}
			if job.State != tt.want {
				t.Errorf("state %+v, want %+v", job.State, tt.want)
			}
		})
	}
}

// checkErrs checks that err contains every one of errs (true: errs were
// wanted), or that there is no error when errs is nil.
func checkErrs(t *testing.T, err error, errs []string) bool {
	t.Helper()
	if errs == nil {
		if err != nil {
			t.Fatal(err)
		}
		return false
	}
	if err == nil {
		t.Fatalf("no error, want %q", errs)
	}
	for _, e := range errs {
		if !strings.Contains(err.Error(), e) {
			t.Errorf("error %q\nlacks %q", err, e)
		}
	}
	return true
}

// TestPinNewStart: a nats source starting at new is pinned to the time of
// the job's first start (so that a restart before the first checkpoint
// reads from there), as a copy; other sources and starts stay.
func TestPinNewStart(t *testing.T) {
	job, err := ParseJob([]byte(`name: pin
operators:
  - {uid: a, source: {type: nats, stream: S, start: new}}
  - {uid: b, source: {type: nats, stream: S, start: "seq:5"}}
  - {uid: c, source: {type: generator, count: 1}}
  - {uid: out, sink: {type: discard}, inputs: [a, b, c]}
`), t.TempDir(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	orig := job.Graph.Vertex("a").Spec.(*SourceSpec)
	at := time.Date(2026, 12, 1, 21, 0, 0, 123456789, time.FixedZone("x", 3600))
	PinNewStart(job.Graph, at)
	a := job.Graph.Vertex("a").Spec.(*SourceSpec)
	if a.Start != "time:2026-12-01T20:00:00.123456789Z" || orig.Start != StartNew {
		t.Fatalf("pinned start %q (the original spec now %q)", a.Start, orig.Start)
	}
	if st, err := ParseNATSStart(a.Start); err != nil || !st.Time.Equal(at) {
		t.Fatalf("pinned start parses to %v, %v", st, err)
	}
	if b := job.Graph.Vertex("b").Spec.(*SourceSpec); b.Start != "seq:5" {
		t.Fatalf("seq start changed to %q", b.Start)
	}
}
