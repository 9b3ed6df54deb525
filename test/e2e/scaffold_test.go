package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// offline is the environment of a machine that cannot download Go modules:
// GOPROXY=off, and -mod=mod so that go may change go.mod and go.sum if it
// wanted to (it must not need to). GOWORK=off: a go.work around the
// temporary directory must not help.
var offline = []string{"GOPROXY=off", "GOFLAGS=-mod=mod", "GOWORK=off", "CARGO_NET_OFFLINE=true"}

// scaffoldAndRun creates a project with streamd new in a directory outside
// the repository, runs its unit test with tool, builds it with streamd build
// and runs its job, as the project's README says.
func scaffoldAndRun(t *testing.T, lang string, test []string, extra ...string) string {
	t.Helper()
	dir := t.TempDir()
	r := runEnv(t, dir, "", offline, append([]string{"new", lang, "myop"}, extra...)...)
	if r.code != 0 || !strings.Contains(r.stdout, "next: streamd build myop && streamd run myop/job.yaml") {
		t.Fatalf("streamd new %s myop: exit %d\nstdout: %s\nstderr: %s", lang, r.code, r.stdout, r.stderr)
	}
	proj := filepath.Join(dir, "myop")

	cmd := exec.Command(test[0], test[1:]...)
	cmd.Dir = proj
	cmd.Env = append(append(os.Environ(), offline...), "CARGO_TARGET_DIR="+filepath.Join(proj, "target"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s in the new project: %v\n%s", strings.Join(test, " "), err, out)
	}

	r = runEnv(t, dir, "", offline, "build", "myop")
	wasm := filepath.Join(proj, "myop.wasm")
	if r.code != 0 || r.stdout != "built "+wasm+" ("+kib(t, wasm)+" KiB)\n" {
		t.Fatalf("streamd build myop: exit %d\nstdout: %s\nstderr: %s", r.code, r.stdout, r.stderr)
	}
	r = runEnv(t, dir, "", offline, "run", "--progress", "off", "myop/job.yaml")
	if r.code != 0 {
		t.Fatalf("streamd run myop/job.yaml: exit %d\nstderr: %s", r.code, r.stderr)
	}
	in, err := os.ReadFile(filepath.Join(proj, "input.txt"))
	must(t, err)
	out, err := os.ReadFile(filepath.Join(proj, "out", "part-0"))
	must(t, err)
	if want := strings.ToUpper(string(in)); string(out) != want || want == "" {
		t.Fatalf("out/part-0 = %q, want the input upper-cased %q", out, want)
	}
	return proj
}

func kib(t *testing.T, path string) string {
	fi, err := os.Stat(path)
	must(t, err)
	return strconv.FormatInt((fi.Size()+1023)/1024, 10)
}

// TestScaffoldGo: streamd new go, go test, streamd build, streamd run, outside
// the repository and without the module proxy. The project needs no download
// (its go.sum stays empty) and its module graph is itself and the SDK copy.
func TestScaffoldGo(t *testing.T) {
	proj := scaffoldAndRun(t, "go", []string{"go", "test", "./..."}, "--module", "example.com/team/myop")
	if sum, err := os.ReadFile(filepath.Join(proj, "go.sum")); err == nil && len(strings.TrimSpace(string(sum))) > 0 {
		t.Errorf("go.sum of the new project is not empty:\n%s", sum)
	}
	cmd := exec.Command("go", "list", "-m", "all")
	cmd.Dir = proj
	cmd.Env = append(os.Environ(), offline...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list -m all: %v\n%s", err, out)
	}
	if want := "example.com/team/myop\ngithub.com/streamd/streamd/sdk/go v0.0.0-00010101000000-000000000000 => ./.streamd/sdk-go\n"; string(out) != want {
		t.Errorf("module graph:\n%s\nwant:\n%s", out, want)
	}
}

// TestScaffoldRust: streamd new rust, cargo test, streamd build, streamd run,
// outside the repository and offline.
func TestScaffoldRust(t *testing.T) {
	test := []string{"cargo", "test", "--offline"}
	if _, err := os.Stat("/usr/bin/cargo"); err == nil {
		test = []string{"env", "RUSTC=/usr/bin/rustc", "/usr/bin/cargo", "test", "--offline"}
	}
	proj := scaffoldAndRun(t, "rust", test)
	lock := filepath.Join(proj, "Cargo.lock")
	if b, err := os.ReadFile(lock); err != nil || !strings.Contains(string(b), "\nversion = 3\n") {
		t.Fatalf("the new project's Cargo.lock (%v):\n%s\nwant version 3 (Debian's cargo 1.65 reads no later one)", err, b)
	}

	// A newer cargo first on PATH (rustup's): its cargo test keeps the lock
	// file streamd build's Debian cargo reads.
	if p, err := exec.LookPath("cargo"); err == nil && p != "/usr/bin/cargo" {
		cmd := exec.Command(p, "test", "--offline")
		cmd.Dir = proj
		cmd.Env = append(append(os.Environ(), offline...), "CARGO_TARGET_DIR="+filepath.Join(proj, "target-newer"))
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s test: %v\n%s", p, err, out)
		}
		if r := runEnv(t, filepath.Dir(proj), "", offline, "build", "myop"); r.code != 0 {
			t.Fatalf("streamd build after %s test: exit %d\n%s", p, r.code, r.stderr)
		}
	}
	// A version-4 lock file (a newer cargo writes one for a project that has
	// none) is rewritten as version 3 when Debian's cargo builds.
	if _, err := os.Stat("/usr/bin/cargo"); err == nil {
		b, err := os.ReadFile(lock)
		must(t, err)
		must(t, os.WriteFile(lock, []byte(strings.Replace(string(b), "\nversion = 3\n", "\nversion = 4\n", 1)), 0o644))
		r := runEnv(t, filepath.Dir(proj), "", offline, "build", "myop")
		if r.code != 0 || !strings.Contains(r.stderr, "was a version-4 lock file") {
			t.Fatalf("streamd build with a version-4 Cargo.lock: exit %d\nstderr: %s", r.code, r.stderr)
		}
		if b, err := os.ReadFile(lock); err != nil || !strings.Contains(string(b), "\nversion = 3\n") {
			t.Fatalf("Cargo.lock after the build (%v):\n%s\nwant version 3", err, b)
		}
	}

	// A compile error: cargo's rendered message, and the module left as it was.
	lib := filepath.Join(proj, "src", "lib.rs")
	src, err := os.ReadFile(lib)
	must(t, err)
	must(t, os.WriteFile(lib, []byte(strings.Replace(string(src), "export_map!(transform)", "export_map!(transfrom)", 1)), 0o644))
	before, err := os.ReadFile(filepath.Join(proj, "myop.wasm"))
	must(t, err)
	r := runEnv(t, filepath.Dir(proj), "", offline, "build", "myop")
	if r.code != 1 || !strings.Contains(r.stderr, "streamd: build: cargo build in "+proj+" failed (exit status 101):") ||
		!strings.Contains(r.stderr, "cannot find value `transfrom`") || !strings.Contains(r.stderr, "src/lib.rs:") {
		t.Errorf("build with a compile error: exit %d stderr %q", r.code, r.stderr)
	}
	if after, err := os.ReadFile(filepath.Join(proj, "myop.wasm")); err != nil || string(after) != string(before) {
		t.Errorf("a failed build changed the module (%v)", err)
	}
}

// TestScaffoldErrors: what streamd new and streamd build refuse, and how
// they say it.
func TestScaffoldErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) {
		t.Helper()
		must(t, os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755))
		must(t, os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644))
	}

	// A non-empty directory: refused, nothing written; with --force written, other files kept.
	write("taken/notes.txt", "mine")
	r := run(t, dir, "", "new", "go", "taken")
	if r.code != 1 || !strings.Contains(r.stderr, "streamd: new: directory taken is not empty; nothing written") {
		t.Errorf("new into a non-empty directory: exit %d stderr %q", r.code, r.stderr)
	}
	if entries, _ := os.ReadDir(filepath.Join(dir, "taken")); len(entries) != 1 {
		t.Errorf("new into a non-empty directory wrote files: %v", entries)
	}
	r = run(t, dir, "", "new", "go", "taken", "--force")
	if r.code != 0 {
		t.Errorf("new --force: exit %d stderr %q", r.code, r.stderr)
	}
	for _, f := range []string{"notes.txt", "main.go", "job.yaml", ".streamd/sdk-go/go.mod"} {
		if _, err := os.Stat(filepath.Join(dir, "taken", f)); err != nil {
			t.Errorf("after new --force: %v", err)
		}
	}

	// Bad names and flags are usage errors (exit 2).
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"new", "go", "1st"}, `project name "1st": want a letter, then letters, digits`},
		{[]string{"new", "go", "a b"}, `project name "a b"`},
		{[]string{"new", "rust", "match"}, `project name "match": a Rust crate cannot be named so`},
		{[]string{"new", "rust", "streamd"}, `project name "streamd": a Rust crate cannot be named so`},
		{[]string{"new", "java", "x"}, `new: unknown language "java" (want go or rust)`},
		{[]string{"new", "rust", "x", "--module", "m"}, "new: --module applies only to a Go project"},
		{[]string{"new", "go", "x", "--module", "a//b"}, `--module "a//b": not a Go module path`},
		{[]string{"new", "go"}, "new: want 2 argument(s), got 1"},
		{[]string{"build", "a", "b"}, "build: want at most 1 argument, got 2"},
	} {
		r := run(t, dir, "", tc.args...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("streamd %s: exit %d stderr %q, want exit 2 and %q", strings.Join(tc.args, " "), r.code, r.stderr, tc.want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "x")); err == nil {
		t.Error("a refused streamd new created its directory")
	}

	// What build refuses (exit 1).
	write("nojob/go.mod", "module nojob\n")
	write("nowasm/go.mod", "module nowasm\n")
	write("nowasm/job.yaml", "name: j\noperators:\n  - uid: gen\n    source: {type: generator, count: 1}\n  - uid: out\n    sink: {type: discard}\n    inputs: [gen]\n")
	write("twomods/go.mod", "module twomods\n")
	write("twomods/job.yaml", "name: j\noperators:\n  - uid: gen\n    source: {type: generator, count: 1}\n  - uid: a\n    wasm: a.wasm\n    inputs: [gen]\n  - uid: b\n    wasm: b.wasm\n    inputs: [a]\n  - uid: out\n    sink: {type: discard}\n    inputs: [b]\n")
	write("nolang/job.yaml", "name: j\noperators:\n  - uid: gen\n    source: {type: generator, count: 1}\n  - uid: a\n    wasm: a.wasm\n    inputs: [gen]\n")
	write("badjob/go.mod", "module badjob\n")
	write("badjob/job.yaml", "name: j\noperators:\n  - uid: a\n    wasm: a.wasm\n    colour: red\n")
	for _, tc := range []struct {
		args []string
		env  []string
		want string
	}{
		{[]string{"build", "nojob"}, nil, "nojob has no job.yaml: streamd build writes the module that the job file's wasm operator names"},
		{[]string{"build", "nowasm"}, nil, "nowasm/job.yaml has no wasm operator: it names no module to build"},
		{[]string{"build", "twomods"}, nil, "names 2 modules (" + filepath.Join(dir, "twomods", "a.wasm") + ", " + filepath.Join(dir, "twomods", "b.wasm") + ", operators a, b): one project builds one module"},
		{[]string{"build", "nolang"}, nil, "nolang has neither go.mod nor Cargo.toml: not a Go or Rust project"},
		{[]string{"build", "badjob"}, nil, `badjob/job.yaml: operator "a" (line 5): colour: unknown field`},
		{[]string{"build", "notthere"}, nil, "build: notthere is not a directory"},
		{[]string{"build", "taken"}, []string{"PATH=" + t.TempDir()}, "build: the go command is not on PATH: install Go 1.24 or newer"},
	} {
		r := runEnv(t, dir, "", tc.env, tc.args...)
		if r.code != 1 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("streamd %s: exit %d stderr %q, want exit 1 and %q", strings.Join(tc.args, " "), r.code, r.stderr, tc.want)
		}
	}

	// A compile error: the compiler's message, and no module written.
	main, err := os.ReadFile(filepath.Join(dir, "taken", "main.go"))
	must(t, err)
	write("taken/main.go", strings.Replace(string(main), "return nil\n", "return nil +\n", 1))
	r = runEnv(t, dir, "", offline, "build", "taken")
	if r.code != 1 || !strings.Contains(r.stderr, "streamd: build: go build in "+filepath.Join(dir, "taken")+" failed (exit status 1):") ||
		!strings.Contains(r.stderr, "main.go:") || !strings.Contains(r.stderr, "syntax error") {
		t.Errorf("build with a syntax error: exit %d stderr %q", r.code, r.stderr)
	}
	if _, err := os.Stat(filepath.Join(dir, "taken", "taken.wasm")); err == nil {
		t.Error("a failed build wrote the module")
	}
}
