package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/streamd/streamd/internal/jobfile"
)

func (c *cli) buildCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "build [DIR]",
		Short: "Build a Go or Rust operator project into the .wasm module its job.yaml names",
		Long: `Build the operator project in DIR (default: the current directory) into the
WebAssembly module that DIR/job.yaml names: the wasm: field of its wasm
operator, relative to the job file. A project with a go.mod is built with

  GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o MODULE .

and one with a Cargo.toml with

  cargo build --release --target wasm32-unknown-unknown --offline

(Debian's /usr/bin/cargo with RUSTC=/usr/bin/rustc when both exist, else the
cargo on PATH), whose .wasm is copied to MODULE. The compiler's output is shown
when the build fails. Projects made by streamd new build as created.`,
		Example: `  streamd build
  streamd build myop && streamd run myop/job.yaml`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) > 1 {
				return usagef("build: want at most 1 argument, got %d (usage: %s)", len(args), cmd.UseLine())
			}
			return nil
		},
		ValidArgsFunction: completeDir,
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := "."
			if len(args) == 1 {
				dir = args[0]
			}
			out, err := c.build(cmd.Context(), dir)
			if err != nil {
				return err
			}
			fi, err := os.Stat(out)
			if err != nil {
				return fmt.Errorf("build: %w", err)
			}
			fmt.Fprintf(c.stdout, "built %s (%d KiB)\n", out, (fi.Size()+1023)/1024)
			return nil
		},
	}
}

// build builds the project in dir and returns the module's absolute path.
func (c *cli) build(ctx context.Context, dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("build: %w", err)
	}
	if fi, err := os.Stat(abs); err != nil || !fi.IsDir() {
		return "", fmt.Errorf("build: %s is not a directory", dir)
	}
	out, err := buildTarget(abs)
	if err != nil {
		return "", err
	}
	hasGo, hasCargo := exists(filepath.Join(abs, "go.mod")), exists(filepath.Join(abs, "Cargo.toml"))
	switch {
	case hasGo && hasCargo:
		return "", fmt.Errorf("build: %s has both go.mod and Cargo.toml: cannot tell whether to build Go or Rust", dir)
	case hasGo:
		err = c.buildGo(ctx, abs, out)
	case hasCargo:
		err = c.buildRust(ctx, abs, out)
	default:
		return "", fmt.Errorf("build: %s has neither go.mod nor Cargo.toml: not a Go or Rust project (streamd new creates one)", dir)
	}
	if err != nil {
		return "", err
	}
	return out, nil
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// buildTarget returns the module path that dir/job.yaml names.
func buildTarget(dir string) (string, error) {
	jobPath := filepath.Join(dir, "job.yaml")
	if _, err := os.Stat(jobPath); errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("build: %s has no job.yaml: streamd build writes the module that the job file's wasm operator names", dir)
	}
	job, err := jobfile.LoadJob(jobPath, jobfile.Options{ModulesNotBuilt: true})
	if err != nil {
		return "", err
	}
	var paths, uids []string
	for _, v := range job.Graph.Vertices {
		if ws, ok := v.Spec.(*jobfile.WasmSpec); ok {
			uids = append(uids, v.UID)
			if !slices.Contains(paths, ws.Path) {
				paths = append(paths, ws.Path)
			}
		}
	}
	switch len(paths) {
	case 0:
		return "", fmt.Errorf("build: %s has no wasm operator: it names no module to build", jobPath)
	case 1:
		return paths[0], nil
	}
	return "", fmt.Errorf("build: %s names %d modules (%s, operators %s): one project builds one module; give each module its own project and job file",
		jobPath, len(paths), strings.Join(paths, ", "), strings.Join(uids, ", "))
}

// runTool runs a build tool and returns its standard output; when it fails,
// the error holds what it printed on standard error (and on standard output,
// unless that is cargo's JSON).
func runTool(ctx context.Context, cmd *exec.Cmd, what string, jsonStdout bool) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		msg := stderr.String()
		if !jsonStdout {
			msg = stdout.String() + msg
		}
		return nil, fmt.Errorf("build: %s failed (%v):\n%s", what, err, strings.TrimRight(msg, "\n"))
	}
	return stdout.Bytes(), nil
}

func (c *cli) buildGo(ctx context.Context, dir, out string) error {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return errors.New("build: the go command is not on PATH: install Go 1.24 or newer (https://go.dev/doc/install)")
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return fmt.Errorf("build: %w", err)
	}
	args := []string{"build", "-buildmode=c-shared", "-o", out, "."}
	fmt.Fprintf(c.stderr, "GOOS=wasip1 GOARCH=wasm %s %s\n", goBin, strings.Join(args, " "))
	cmd := exec.CommandContext(ctx, goBin, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	_, err = runTool(ctx, cmd, "go build in "+dir, false)
	return err
}

// Debian's Rust toolchain (apt-get install rustc cargo libstd-rust-dev-wasm32).
var debianCargo, debianRustc = "/usr/bin/cargo", "/usr/bin/rustc"

// rustToolchain returns the cargo to run and the environment it needs:
// Debian's cargo and rustc when both are installed (only Debian's rustc has
// the wasm32 standard library offline, and a rustup cargo fails with it),
// else the cargo on PATH.
func rustToolchain() (cargo string, env []string, err error) {
	if exists(debianCargo) && exists(debianRustc) {
		return debianCargo, []string{"RUSTC=" + debianRustc}, nil
	}
	if p, err := exec.LookPath("cargo"); err == nil {
		return p, nil, nil
	}
	return "", nil, errors.New("build: cargo is not installed: on Debian `apt-get install rustc cargo libstd-rust-dev-wasm32`; with rustup (https://rustup.rs) `rustup target add wasm32-unknown-unknown`")
}

// downgradeCargoLock rewrites a version-4 Cargo.lock, which cargo 1.78
// and later write for a new project, as version 3: Debian's cargo (1.65)
// cannot read version 4, and a newer cargo keeps a lock file's version.
// The two versions differ only in how git sources are written, so a lock
// file without git sources changes in its version line alone; one with
// them is left alone, with an error that says what to do.
func downgradeCargoLock(lock string, stderr io.Writer) error {
	b, err := os.ReadFile(lock)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("build: %w", err)
	}
	const v4, v3 = "\nversion = 4\n", "\nversion = 3\n"
	if !bytes.Contains(b, []byte(v4)) {
		return nil
	}
	if bytes.Contains(b, []byte(`source = "git+`)) {
		return fmt.Errorf("build: %s is a version-4 lock file (written by cargo 1.78 or later) with git sources, which Debian's cargo %s cannot read: delete it, or set `version = 3` in it and run a newer `cargo update`", lock, debianCargo)
	}
	b = bytes.Replace(b, []byte(v4), []byte(v3), 1)
	if err := writeFileAtomic(lock, b); err != nil {
		return fmt.Errorf("build: %w", err)
	}
	fmt.Fprintf(stderr, "build: %s was a version-4 lock file (a newer cargo wrote it); rewrote it as version 3, which Debian's cargo reads and newer ones keep\n", lock)
	return nil
}

// rustHints explain the failures of a Rust toolchain that cargo's own
// message leaves obscure.
var rustHints = []struct{ in, hint string }{
	{"can't find crate for `core`", "the wasm32-unknown-unknown standard library is missing: on Debian `apt-get install libstd-rust-dev-wasm32`, with rustup `rustup target add wasm32-unknown-unknown`"},
	{"target may not be installed", "the wasm32-unknown-unknown standard library is missing: on Debian `apt-get install libstd-rust-dev-wasm32`, with rustup `rustup target add wasm32-unknown-unknown`"},
	{"unknown print request", "cargo and rustc come from different toolchains (a rustup cargo with Debian's rustc?): use one toolchain's pair"},
}

func (c *cli) buildRust(ctx context.Context, dir, out string) error {
	cargo, env, err := rustToolchain()
	if err != nil {
		return err
	}
	manifest := filepath.Join(dir, "Cargo.toml")
	if cargo == debianCargo {
		if err := downgradeCargoLock(filepath.Join(dir, "Cargo.lock"), c.stderr); err != nil {
			return err
		}
	}
	args := []string{"build", "--release", "--target", "wasm32-unknown-unknown", "--offline",
		"--message-format=json-render-diagnostics", "--manifest-path", manifest}
	fmt.Fprintf(c.stderr, "%s%s %s\n", strings.Join(append(env, ""), " "), cargo, strings.Join(args, " "))
	cmd := exec.CommandContext(ctx, cargo, args...)
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), "CARGO_NET_OFFLINE=true"), env...)
	stdout, err := runTool(ctx, cmd, "cargo build in "+dir, true)
	if err != nil {
		for _, h := range rustHints {
			if strings.Contains(err.Error(), h.in) {
				return fmt.Errorf("%w\n%s", err, h.hint)
			}
		}
		return err
	}
	// cargo says in its JSON messages where it wrote each artifact.
	var artifact string
	sc := bufio.NewScanner(bytes.NewReader(stdout))
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var m struct {
			Reason       string   `json:"reason"`
			ManifestPath string   `json:"manifest_path"`
			Filenames    []string `json:"filenames"`
		}
		if json.Unmarshal(sc.Bytes(), &m) != nil || m.Reason != "compiler-artifact" {
			continue
		}
		for _, f := range m.Filenames {
			if strings.HasSuffix(f, ".wasm") && sameFile(m.ManifestPath, manifest) {
				artifact = f
			}
		}
	}
	if artifact == "" {
		return fmt.Errorf("build: cargo build in %s made no .wasm: Cargo.toml needs [lib] crate-type = [\"cdylib\"]", dir)
	}
	b, err := os.ReadFile(artifact)
	if err != nil {
		return fmt.Errorf("build: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return fmt.Errorf("build: %w", err)
	}
	if err := writeFileAtomic(out, b); err != nil {
		return fmt.Errorf("build: %w", err)
	}
	return nil
}

// writeFileAtomic writes path through a temporary file and a rename, so a
// failure leaves the old file as it was.
func writeFileAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

func sameFile(a, b string) bool {
	fa, err1 := os.Stat(a)
	fb, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(fa, fb)
}
