package main

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	streamd "github.com/streamd/streamd/sdk/go"
	rustsdk "github.com/streamd/streamd/sdk/rust"
)

// TestNewWritesSDK: a new project holds a byte-for-byte copy of the SDK the
// binary embeds, and its go.mod / Cargo.toml point at it.
func TestNewWritesSDK(t *testing.T) {
	for _, tc := range []struct {
		lang, sdkDir, manifest, ref string
		sdk                         fs.FS
	}{
		{"go", sdkGoDir, "go.mod", "replace github.com/streamd/streamd/sdk/go => ./.streamd/sdk-go\n", streamd.SDKFiles},
		{"rust", sdkRustDir, "Cargo.toml", `streamd = { path = ".streamd/sdk-rust" }` + "\n", rustsdk.Files},
	} {
		t.Run(tc.lang, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "proj")
			var out, errb bytes.Buffer
			if code := newCLI(strings.NewReader(""), &out, &errb).execute(context.Background(), []string{"new", tc.lang, dir}); code != exitOK {
				t.Fatalf("exit %d: %s", code, errb.String())
			}
			n := 0
			err := fs.WalkDir(tc.sdk, ".", func(p string, d fs.DirEntry, err error) error {
				if err != nil || d.IsDir() {
					return err
				}
				want, _ := fs.ReadFile(tc.sdk, p)
				got, err := os.ReadFile(filepath.Join(dir, tc.sdkDir, p))
				if err != nil || !bytes.Equal(got, want) {
					t.Errorf("%s/%s is not the embedded file (%v)", tc.sdkDir, p, err)
				}
				n++
				return nil
			})
			if err != nil || n < 5 {
				t.Fatalf("walked %d embedded files: %v", n, err)
			}
			m, err := os.ReadFile(filepath.Join(dir, tc.manifest))
			if err != nil || !strings.Contains(string(m), tc.ref) {
				t.Errorf("%s lacks %q:\n%s", tc.manifest, tc.ref, m)
			}
			if tc.lang == "go" && !strings.Contains(string(m), "module proj\n\ngo 1.") {
				t.Errorf("go.mod: want module proj and the SDK's go line:\n%s", m)
			}
		})
	}
}

// TestNewForceReplacesSDK: --force replaces the SDK copy as a whole (no file
// of an older SDK stays) and keeps the user's other files.
func TestNewForceReplacesSDK(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "proj")
	stale := filepath.Join(dir, sdkGoDir, "removed_in_this_version.go")
	mine := filepath.Join(dir, "notes.txt")
	for _, f := range []string{stale, mine} {
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var out, errb bytes.Buffer
	if code := newCLI(strings.NewReader(""), &out, &errb).execute(context.Background(), []string{"new", "go", dir, "--force"}); code != exitOK {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if _, err := os.Stat(stale); err == nil {
		t.Error("--force kept a file of the old SDK copy")
	}
	if _, err := os.Stat(mine); err != nil {
		t.Errorf("--force removed a file of the user: %v", err)
	}
}

// TestBuildNoCargo: without any cargo, build says which binary is missing
// and how to install it.
func TestBuildNoCargo(t *testing.T) {
	dir := t.TempDir()
	var out, errb bytes.Buffer
	c := newCLI(strings.NewReader(""), &out, &errb)
	if code := c.execute(context.Background(), []string{"new", "rust", filepath.Join(dir, "r")}); code != exitOK {
		t.Fatalf("new: exit %d: %s", code, errb.String())
	}
	oldCargo, oldRustc := debianCargo, debianRustc
	t.Cleanup(func() { debianCargo, debianRustc = oldCargo, oldRustc })
	debianCargo, debianRustc = filepath.Join(dir, "no-cargo"), filepath.Join(dir, "no-rustc")
	t.Setenv("PATH", dir)
	errb.Reset()
	if code := newCLI(strings.NewReader(""), &out, &errb).execute(context.Background(), []string{"build", filepath.Join(dir, "r")}); code != exitFailed {
		t.Fatalf("build: exit %d, want %d", code, exitFailed)
	}
	if want := "streamd: build: cargo is not installed: on Debian `apt-get install rustc cargo libstd-rust-dev-wasm32`; with rustup (https://rustup.rs) `rustup target add wasm32-unknown-unknown`\n"; errb.String() != want {
		t.Errorf("stderr %q, want %q", errb.String(), want)
	}
}
