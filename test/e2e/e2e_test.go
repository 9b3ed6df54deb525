// Package e2e runs the streamd binary as a user would: each example job at
// parallelism 1 and 4 against its expected output, a window count on shuffled
// out-of-order input against a reference computed here, invalid job files
// against their expected errors, a module as a Unix filter, a failing guest,
// and Ctrl-C.
package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/streamd/streamd/internal/testwasm"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testwasm.RemoveBuilt()
	os.Exit(code)
}

// streamd builds cmd/streamd once per test process and returns the binary's path.
func streamd(t *testing.T) string {
	t.Helper()
	return testwasm.Streamd(t)
}

type result struct {
	code           int
	stdout, stderr string
}

// run runs streamd with args in dir, with stdin, a private cache dir and quiet progress.
func run(t *testing.T, dir, stdin string, args ...string) result {
	t.Helper()
	return runEnv(t, dir, stdin, nil, args...)
}

// runEnv is run with env added to the environment.
func runEnv(t *testing.T, dir, stdin string, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, streamd(t), args...)
	cmd.Dir = dir
	cmd.Stdin = strings.NewReader(stdin)
	cmd.Env = append(append(os.Environ(), "STREAMD_WASM_CACHE_DIR="+cacheDir(t)), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("streamd %v: %v", args, err)
	}
	if ctx.Err() != nil {
		t.Fatalf("streamd %v: timed out\nstderr:\n%s", args, errb.String())
	}
	return result{code, out.String(), errb.String()}
}

var (
	cacheOnce sync.Once
	cache     string
)

// cacheDir is a compiled-module cache shared by the runs of this process.
func cacheDir(t *testing.T) string {
	cacheOnce.Do(func() {
		streamd(t)
		cache = filepath.Join(testwasm.BinDir(), "cache")
	})
	return cache
}

// example copies the top-level files of examples/wasm/<name> (job file,
// input, expected output and the modules the job names, built first) into a
// new directory, so runs write their output there and not into the repository.
func example(t *testing.T, name, jobFile string) string {
	t.Helper()
	root, err := testwasm.Root()
	if err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(root, "examples", "wasm", name)
	dst := t.TempDir()
	for _, m := range modulesOf(t, filepath.Join(src, jobFile)) {
		if filepath.IsAbs(m) {
			continue
		}
		built := testwasm.Path(t, filepath.ToSlash(filepath.Join("examples", "wasm", name, m)))
		b, err := os.ReadFile(built)
		if err != nil {
			t.Fatal(err)
		}
		must(t, os.MkdirAll(filepath.Dir(filepath.Join(dst, m)), 0o755))
		must(t, os.WriteFile(filepath.Join(dst, m), b, 0o644))
	}
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// modulesOf returns the wasm paths a job file names.
func modulesOf(t *testing.T, jobPath string) []string {
	t.Helper()
	b, err := os.ReadFile(jobPath)
	if err != nil {
		t.Fatal(err)
	}
	var job struct {
		Operators []struct {
			Wasm string `yaml:"wasm"`
		} `yaml:"operators"`
	}
	if err := yaml.Unmarshal(b, &job); err != nil {
		t.Fatalf("%s: %v", jobPath, err)
	}
	var mods []string
	for _, op := range job.Operators {
		if op.Wasm != "" {
			mods = append(mods, op.Wasm)
		}
	}
	return mods
}

// outputLines returns the lines of every part file in dir, in part order.
func outputLines(t *testing.T, dir string) []string {
	t.Helper()
	parts, err := filepath.Glob(filepath.Join(dir, "part-*"))
	if err != nil {
		t.Fatal(err)
	}
	if len(parts) == 0 {
		t.Fatalf("no part files in %s", dir)
	}
	sort.Strings(parts)
	var lines []string
	for _, p := range parts {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, splitLines(string(b))...)
	}
	return lines
}

func splitLines(s string) []string {
	s = strings.TrimSuffix(s, "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

func sorted(s []string) []string {
	c := append([]string(nil), s...)
	sort.Strings(c)
	return c
}

func diffLines(t *testing.T, what string, got, want []string) {
	t.Helper()
	if strings.Join(got, "\n") == strings.Join(want, "\n") {
		return
	}
	n := 0
	for i := 0; i < max(len(got), len(want)) && n < 10; i++ {
		var g, w string
		if i < len(got) {
			g = got[i]
		}
		if i < len(want) {
			w = want[i]
		}
		if g != w {
			t.Errorf("%s line %d: got %q, want %q", what, i+1, g, w)
			n++
		}
	}
	t.Fatalf("%s: %d lines, want %d", what, len(got), len(want))
}

// exampleJobs lists every examples/wasm/*/*.yaml.
func exampleJobs(t *testing.T) [][2]string {
	root, err := testwasm.Root()
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(root, "examples", "wasm", "*", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var jobs [][2]string
	for _, f := range files {
		jobs = append(jobs, [2]string{filepath.Base(filepath.Dir(f)), filepath.Base(f)})
	}
	return jobs
}

func TestExampleJobs(t *testing.T) {
	jobs := exampleJobs(t)
	want := map[string]bool{"uppercase": false, "window-count": false, "wordcount": false, "sessionize": false, "interval-join": false}
	for _, j := range jobs {
		want[j[0]] = true
	}
	for name, found := range want {
		if !found {
			t.Errorf("example %s has no job file", name)
		}
	}
	for _, j := range jobs {
		name, jobFile := j[0], j[1]
		for _, p := range []int{1, 4} {
			t.Run(fmt.Sprintf("%s/p%d", name, p), func(t *testing.T) {
				dir := example(t, name, jobFile)
				r := run(t, dir, "", "run", "--parallelism", fmt.Sprint(p), "--progress", "log", jobFile)
				if r.code != 0 {
					t.Fatalf("exit %d\nstderr:\n%s", r.code, r.stderr)
				}
				outDir := filepath.Join(dir, "out")
				if !strings.Contains(r.stderr, outDir) {
					t.Errorf("stderr does not say where the output is (%s):\n%s", outDir, r.stderr)
				}
				if !strings.Contains(r.stderr, "msg=summary") {
					t.Errorf("no summary in stderr:\n%s", r.stderr)
				}
				b, err := os.ReadFile(filepath.Join(dir, "expected.txt"))
				if err != nil {
					t.Fatal(err)
				}
				got, exp := outputLines(t, outDir), splitLines(string(b))
				if name == "uppercase" && p == 1 {
					diffLines(t, "output (in order)", got, exp) // one subtask, forward edges: order is kept
				}
				diffLines(t, "sorted output", sorted(got), sorted(exp))
			})
		}
	}
}

// TestWindowCountShuffled runs the window-count job on a shuffled input with
// out-of-order timestamps and compares every window with a reference.
func TestWindowCountShuffled(t *testing.T) {
	const size = 10000 // size_ms in window-count.yaml
	rnd := rand.New(rand.NewSource(7))
	keys := []string{"alice", "bob", "carol", "dave", "erin", "frank", "grace"}
	type win struct {
		key   string
		start int64
	}
	ref := map[win]int{}
	var lines []string
	for i := 0; i < 5000; i++ {
		k := keys[rnd.Intn(len(keys))]
		ts := int64(rnd.Intn(600_000)) // ten minutes: 60 windows per key
		lines = append(lines, fmt.Sprintf("%s,%d", k, ts))
		ref[win{k, ts / size * size}]++
	}
	rnd.Shuffle(len(lines), func(i, j int) { lines[i], lines[j] = lines[j], lines[i] })
	var want []string
	for w, n := range ref {
		want = append(want, fmt.Sprintf("%s,%d,%d,%d", w.key, w.start, w.start+size, n))
	}
	for _, p := range []int{1, 4} {
		t.Run(fmt.Sprintf("p%d", p), func(t *testing.T) {
			dir := example(t, "window-count", "window-count.yaml")
			if err := os.WriteFile(filepath.Join(dir, "input.txt"), []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			r := run(t, dir, "", "run", "-p", fmt.Sprint(p), "--progress", "off", "window-count.yaml")
			if r.code != 0 {
				t.Fatalf("exit %d\nstderr:\n%s", r.code, r.stderr)
			}
			diffLines(t, "windows", sorted(outputLines(t, filepath.Join(dir, "out"))), sorted(want))
		})
	}
}

// TestFilter runs a module without a job file, as a Unix filter.
func TestFilter(t *testing.T) {
	mod := testwasm.Path(t, "examples/wasm/uppercase/uppercase.wasm")
	dir := t.TempDir()
	in := "hello world\nstreamd\n\nGrüße\n"
	r := run(t, dir, in, "run", mod)
	if r.code != 0 {
		t.Fatalf("exit %d\nstderr:\n%s", r.code, r.stderr)
	}
	if want := "HELLO WORLD\nSTREAMD\n\nGRÜSSE\n"; r.stdout != want && r.stdout != "HELLO WORLD\nSTREAMD\n\nGRÜßE\n" {
		t.Errorf("stdout %q, want %q", r.stdout, want)
	}
	if r.stderr != "" {
		t.Errorf("a filter should be quiet on stderr, got:\n%s", r.stderr)
	}

	// A file source and a file sink at parallelism 3.
	var lines []string
	for i := 0; i < 1000; i++ {
		lines = append(lines, fmt.Sprintf("line %d", i))
	}
	if err := os.WriteFile(filepath.Join(dir, "in.txt"), []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r = run(t, dir, "", "run", mod, "--source", "file:in.txt", "--sink", "file:out", "-p", "3")
	if r.code != 0 {
		t.Fatalf("exit %d\nstderr:\n%s", r.code, r.stderr)
	}
	var want []string
	for _, l := range lines {
		want = append(want, strings.ToUpper(l))
	}
	got := outputLines(t, filepath.Join(dir, "out"))
	diffLines(t, "filter output", sorted(got), sorted(want))

	// A generator into discard.
	r = run(t, dir, "", "run", mod, "--source", "generator:5000", "--sink", "discard")
	if r.code != 0 || r.stdout != "" {
		t.Fatalf("generator:5000 -> discard: exit %d stdout %q\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}

	// Bad flags are usage errors.
	r = run(t, dir, "", "run", mod, "--source", "kafka:x")
	if r.code != 1 || !strings.Contains(r.stderr, `streamd: jobfile: --source: unknown source "kafka:x"`) {
		t.Errorf("--source kafka:x: exit %d stderr %q", r.code, r.stderr)
	}
	r = run(t, dir, "", "run", mod, "--config", "novalue")
	if r.code != 2 || !strings.Contains(r.stderr, `streamd: --config "novalue": want KEY=VALUE`) {
		t.Errorf("--config novalue: exit %d stderr %q", r.code, r.stderr)
	}
}

// TestInvalidJobFiles checks that each broken job file fails with the
// expected error, a non-zero exit, and without creating its output directory.
func TestInvalidJobFiles(t *testing.T) {
	count := testwasm.Path(t, "examples/wasm/wordcount/count.wasm")
	const head = "name: bad\noperators:\n  - uid: lines\n    source: {type: file, path: input.txt}\n"
	tests := []struct {
		name, job, want string
	}{
		{"unknown input", head + "  - uid: count\n    wasm: count.wasm\n    inputs: [{from: lnes, partition: hash}]\n  - uid: out\n    sink: {type: file, path: out/}\n    inputs: [count]\n",
			`streamd: jobfile: job.yaml: operator "count" (line 7): inputs[0].from: unknown operator "lnes"`},
		{"cycle", head + "  - uid: a\n    wasm: count.wasm\n    inputs: [lines, b]\n  - uid: b\n    wasm: count.wasm\n    inputs: [a]\n  - uid: out\n    sink: {type: file, path: out/}\n    inputs: [b]\n",
			`operator "a" (line 7): inputs[1].from: cycle: a -> b -> a`},
		{"duplicate uid", head + "  - uid: lines\n    sink: {type: file, path: out/}\n    inputs: [lines]\n",
			`operator "lines" (line 5): uid: duplicate uid "lines", first used on line 3`},
		{"forward between parallelisms", head + "  - uid: out\n    parallelism: 3\n    sink: {type: file, path: out/}\n    inputs: [lines]\n",
			`operator "out" (line 8): inputs[0].partition: forward from "lines" (parallelism 1) to "out" (parallelism 3) needs equal parallelism`},
		{"parallelism below 1", head + "  - uid: out\n    parallelism: 0\n    sink: {type: file, path: out/}\n    inputs: [{from: lines, partition: rebalance}]\n",
			`operator "out" (line 6): parallelism: must be at least 1, got 0`},
		{"parallelism above max", "max_parallelism: 4\n" + head + "  - uid: out\n    parallelism: 5\n    sink: {type: file, path: out/}\n    inputs: [{from: lines, partition: rebalance}]\n",
			`operator "out" (line 7): parallelism: 5 is above max_parallelism 4`},
		{"missing module", head + "  - uid: count\n    wasm: nothere.wasm\n    inputs: [lines]\n  - uid: out\n    sink: {type: file, path: out/}\n    inputs: [count]\n",
			`operator "count" (line 6): wasm: cannot read module`},
		{"unknown source type", "name: bad\noperators:\n  - uid: k\n    source: {type: kinesis}\n  - uid: out\n    sink: {type: file, path: out/}\n    inputs: [k]\n",
			`operator "k" (line 4): source.type: unknown source type "kinesis" (want file, generator, nats, kafka or nexmark)`},
		{"unknown sink type", head + "  - uid: out\n    sink: {type: s3, path: out/}\n    inputs: [lines]\n",
			`operator "out" (line 6): sink.type: unknown sink type "s3"`},
		{"typo", head + "  - uid: out\n    sink: {type: file, path: out/}\n    inptus: [lines]\n",
			`operator "out" (line 7): inptus: unknown field (did you mean "inputs"?)`},
		{"yaml syntax", "name: bad\noperators: [\n", `streamd: jobfile: job.yaml: line 2: YAML: did not find expected node content`},
		{"module without exports", head + "  - uid: count\n    wasm: empty.wasm\n    inputs: [lines]\n  - uid: out\n    sink: {type: file, path: out/}\n    inputs: [count]\n",
			`empty.wasm`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			must(t, os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(tt.job), 0o644))
			must(t, os.WriteFile(filepath.Join(dir, "input.txt"), []byte("a b c\n"), 0o644))
			b, err := os.ReadFile(count)
			must(t, err)
			must(t, os.WriteFile(filepath.Join(dir, "count.wasm"), b, 0o644))
			must(t, os.WriteFile(filepath.Join(dir, "empty.wasm"), []byte{0, 'a', 's', 'm', 1, 0, 0, 0}, 0o644))
			for _, cmd := range []string{"run", "validate"} {
				r := run(t, dir, "", cmd, "job.yaml")
				if r.code != 1 {
					t.Errorf("%s: exit %d, want 1\nstderr:\n%s", cmd, r.code, r.stderr)
				}
				if !strings.Contains(r.stderr, tt.want) {
					t.Errorf("%s: stderr lacks %q:\n%s", cmd, tt.want, r.stderr)
				}
				if !strings.HasPrefix(r.stderr, "streamd: ") && !strings.Contains(r.stderr, "\nstreamd: ") {
					t.Errorf("%s: no \"streamd: \" line in stderr:\n%s", cmd, r.stderr)
				}
				if _, err := os.Stat(filepath.Join(dir, "out")); !os.IsNotExist(err) {
					t.Fatalf("%s: the invalid job created its output directory", cmd)
				}
			}
		})
	}
}

// TestFailingGuest runs a job whose operator panics: exit 1 and an error
// that names the operator and keeps the guest's message.
func TestFailingGuest(t *testing.T) {
	dir := t.TempDir()
	testwasm.FailingJob(t, dir) // operator "boom" panics (internal/conformance)
	r := run(t, dir, "", "run", "--progress", "off", "job.yaml")
	if r.code != 1 {
		t.Fatalf("exit %d, want 1\nstderr:\n%s", r.code, r.stderr)
	}
	for _, want := range []string{"streamd: ", `"boom"`, "conformance panic"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
		}
	}
	if strings.Contains(r.stderr, "streamd: streamd:") {
		t.Errorf("doubled prefix:\n%s", r.stderr)
	}
}

// foreverJob writes dir/job.yaml: an unbounded generator through uppercase
// into out/, with the job-level sections extra.
func foreverJob(t *testing.T, dir, extra string) {
	t.Helper()
	job := fmt.Sprintf(`name: forever
%soperators:
  - uid: gen
    source: {type: generator, rate: 2000}
  - uid: upper
    wasm: %s
    inputs: [gen]
  - uid: out
    sink: {type: file, path: out/}
    inputs: [upper]
`, extra, testwasm.Path(t, "examples/wasm/uppercase/uppercase.wasm"))
	must(t, os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(job), 0o644))
}

// TestInterrupt sends SIGINT to an unbounded job: it stops cleanly with exit 130.
func TestInterrupt(t *testing.T) {
	dir := t.TempDir()
	foreverJob(t, dir, "")
	cmd := exec.Command(streamd(t), "run", "--progress", "off", "job.yaml")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "STREAMD_WASM_CACHE_DIR="+cacheDir(t))
	var errb bytes.Buffer
	cmd.Stderr = &errb
	must(t, cmd.Start())
	// Wait until records flow (the sink's in-progress file grows), then interrupt.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if fi, err := os.Stat(filepath.Join(dir, "out", ".part-0.inprogress")); err == nil && fi.Size() > 0 {
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("no output after 30s\nstderr:\n%s", errb.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	must(t, cmd.Process.Signal(syscall.SIGINT))
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 130 {
			t.Fatalf("wait: %v, want exit 130\nstderr:\n%s", err, errb.String())
		}
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("streamd did not stop 20s after SIGINT\nstderr:\n%s", errb.String())
	}
	if !strings.Contains(errb.String(), "streamd: canceled") {
		t.Errorf("stderr lacks \"streamd: canceled\":\n%s", errb.String())
	}
}

func TestVersionAndUsage(t *testing.T) {
	dir := t.TempDir()
	r := run(t, dir, "", "version")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "streamd ") || !strings.Contains(r.stdout, "abi v1") {
		t.Errorf("version: exit %d stdout %q", r.code, r.stdout)
	}
	r = run(t, dir, "", "run")
	if r.code != 2 || !strings.Contains(r.stderr, "streamd: run: want 1 argument(s), got 0") {
		t.Errorf("run without args: exit %d stderr %q", r.code, r.stderr)
	}
	r = run(t, dir, "", "frobnicate")
	if r.code != 2 || !strings.HasPrefix(r.stderr, "streamd: unknown command") {
		t.Errorf("unknown command: exit %d stderr %q", r.code, r.stderr)
	}
	r = run(t, dir, "", "run", "--parallelism", "x", "job.yaml")
	if r.code != 2 || !strings.HasPrefix(r.stderr, "streamd: invalid argument") {
		t.Errorf("bad flag: exit %d stderr %q", r.code, r.stderr)
	}
	r = run(t, dir, "", "run", "nothere.yaml")
	if r.code != 1 || !strings.Contains(r.stderr, "streamd: jobfile: open nothere.yaml: no such file or directory") {
		t.Errorf("missing job file: exit %d stderr %q", r.code, r.stderr)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestValidateModule: validate MODULE.wasm loads the module with the host
// and prints what it exports and imports; a broken module gets the host's error.
func TestValidateModule(t *testing.T) {
	mod := testwasm.Path(t, "examples/wasm/uppercase/uppercase.wasm")
	dir := t.TempDir()
	r := run(t, dir, "", "validate", mod)
	if r.code != 0 {
		t.Fatalf("validate %s: exit %d\n%s", mod, r.code, r.stderr)
	}
	for _, want := range []string{"abi v1", "exports:", "streamd_process", "imports streamd_v1: emit"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("validate output lacks %q:\n%s", want, r.stdout)
		}
	}
	b, err := os.ReadFile(mod)
	must(t, err)
	broken := filepath.Join(dir, "broken.wasm")
	must(t, os.WriteFile(broken, b[:len(b)/2], 0o644))
	r = run(t, dir, "", "validate", broken)
	if r.code != 1 || !strings.Contains(r.stderr, "streamd: ") || !strings.Contains(r.stderr, "broken.wasm") ||
		!strings.Contains(r.stderr, "truncated") || strings.Contains(r.stderr, "YAML") {
		t.Errorf("validate of a truncated module: exit %d\n%s", r.code, r.stderr)
	}
}
