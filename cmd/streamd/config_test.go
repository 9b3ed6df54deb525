package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// invoke runs the CLI in-process and returns its exit status, the cli (for its
// resolved configuration) and what it wrote.
func invoke(t *testing.T, args ...string) (int, *cli, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	c := newCLI(strings.NewReader(""), &out, &errb)
	code := c.execute(context.Background(), args)
	return code, c, out.String(), errb.String()
}

func TestConfigPrecedence(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	os.Unsetenv("STREAMD_LOG_LEVEL")
	os.Unsetenv("STREAMD_WASM_MEMORY_LIMIT_MIB")

	check := func(name string, wantLevel string, wantMiB int, wantDeadline time.Duration, args ...string) {
		t.Helper()
		code, c, _, stderr := invoke(t, append(args, "version")...)
		if code != 0 {
			t.Fatalf("%s: exit %d: %s", name, code, stderr)
		}
		if got := c.v.GetString(keyLogLevel); got != wantLevel {
			t.Errorf("%s: log.level = %q, want %q", name, got, wantLevel)
		}
		if got, err := c.positiveInt(keyWasmMemoryLimit); err != nil || got != wantMiB {
			t.Errorf("%s: wasm.memory_limit_mib = %d (%v), want %d", name, got, err, wantMiB)
		}
		if got, err := c.duration(keyWasmDeadline); err != nil || got != wantDeadline {
			t.Errorf("%s: wasm.call_deadline = %v (%v), want %v", name, got, err, wantDeadline)
		}
	}
	check("defaults", "info", 256, time.Minute)

	must(t, os.WriteFile(filepath.Join(dir, "streamd.yaml"), []byte("log: {level: warn}\nwasm: {memory_limit_mib: 512, call_deadline: 30s}\n"), 0o644))
	check("file", "warn", 512, 30*time.Second)

	t.Setenv("STREAMD_LOG_LEVEL", "error")
	t.Setenv("STREAMD_WASM_MEMORY_LIMIT_MIB", "300")
	check("env over file", "error", 300, 30*time.Second)

	check("flags over env", "debug", 100, time.Second, "--log-level", "debug", "--wasm-memory-limit-mib", "100", "--wasm-call-deadline", "1s")

	other := filepath.Join(dir, "other.yaml")
	must(t, os.WriteFile(other, []byte("wasm: {call_deadline: 5s}\n"), 0o644))
	check("--config-file", "error", 300, 5*time.Second, "--config-file", other)
}

func TestConfigErrors(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	tests := []struct {
		name, file string
		args       []string
		want       string
	}{
		{"unknown key", "wasm: {memory_limit: 5}\n", nil, `streamd: config file streamd.yaml: unknown key "wasm.memory_limit"`},
		{"bad level", "log: {level: loud}\n", nil, `streamd: log.level: "loud" is not a log level`},
		{"bad format", "", []string{"--log-format", "xml"}, `streamd: log.format: "xml" is not a log format`},
		{"missing config file", "", []string{"--config-file", "nope.yaml"}, "streamd: config file nope.yaml: "},
		{"bad yaml", "log: [\n", nil, "streamd: config file streamd.yaml: "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			os.Remove(filepath.Join(dir, "streamd.yaml"))
			if tt.file != "" {
				must(t, os.WriteFile(filepath.Join(dir, "streamd.yaml"), []byte(tt.file), 0o644))
			}
			code, _, _, stderr := invoke(t, append(tt.args, "version")...)
			if code != exitUsage || !strings.HasPrefix(stderr, tt.want) {
				t.Errorf("exit %d stderr %q, want %d and %q", code, stderr, exitUsage, tt.want)
			}
		})
	}
}

func TestRunRejectsModuleFlagsForJobFiles(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	must(t, os.WriteFile("job.yaml", []byte("name: x\noperators: []\n"), 0o644))
	code, _, _, stderr := invoke(t, "run", "--sink", "discard", "job.yaml")
	if code != exitUsage || !strings.Contains(stderr, "streamd: --sink applies only when running a .wasm module") {
		t.Errorf("exit %d stderr %q", code, stderr)
	}
	code, _, _, stderr = invoke(t, "run", "job.yaml")
	if code != exitFailed || !strings.Contains(stderr, "streamd: jobfile: job.yaml: line 2: operators: empty") {
		t.Errorf("exit %d stderr %q", code, stderr)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestRestartConfiguration: restart.* in the configuration is the restart
// strategy of job files without a restart section; a job file's own
// section wins; a bad setting is a usage error naming the key.
func TestRestartConfiguration(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	for _, k := range restartKeys {
		t.Setenv("STREAMD_"+strings.ToUpper(strings.ReplaceAll(k, ".", "_")), "")
		os.Unsetenv("STREAMD_" + strings.ToUpper(strings.ReplaceAll(k, ".", "_")))
	}
	job := "name: j\ncheckpoint: {interval: 1s}\noperators:\n  - {uid: gen, source: {type: generator, count: 10}}\n  - {uid: out, sink: {type: discard}, inputs: [gen]}\n"
	must(t, os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(job), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "own.yaml"), []byte(job+"restart: {strategy: none}\n"), 0o644))
	restartLine := func(args ...string) (int, string, string) {
		t.Helper()
		code, _, out, errb := invoke(t, args...)
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "restart: ") {
				return code, l, errb
			}
		}
		return code, "", errb
	}
	if code, l, errb := restartLine("validate", "job.yaml"); code != 0 || !strings.HasPrefix(l, "restart: exponential-delay") {
		t.Fatalf("built-in default: exit %d, %q %s", code, l, errb)
	}
	must(t, os.WriteFile(filepath.Join(dir, "streamd.yaml"), []byte("restart: {strategy: fixed-delay, attempts: 7, delay: 2s}\n"), 0o644))
	if code, l, errb := restartLine("validate", "job.yaml"); code != 0 || l != "restart: fixed-delay, 7 attempts, delay 2s" {
		t.Fatalf("configured: exit %d, %q %s", code, l, errb)
	}
	if code, l, errb := restartLine("validate", "own.yaml"); code != 0 || l != "restart: none" {
		t.Fatalf("the job file's own section: exit %d, %q %s", code, l, errb)
	}
	t.Setenv("STREAMD_RESTART_STRATEGY", "sometimes")
	if code, _, errb := restartLine("validate", "job.yaml"); code != exitUsage || !strings.Contains(errb, "restart.strategy") {
		t.Fatalf("bad strategy: exit %d, %s", code, errb)
	}
	t.Setenv("STREAMD_RESTART_STRATEGY", "exponential-delay")
	t.Setenv("STREAMD_RESTART_MULTIPLIER", "0.5")
	if code, _, errb := restartLine("validate", "job.yaml"); code != exitUsage || !strings.Contains(errb, "multiplier") {
		t.Fatalf("bad multiplier: exit %d, %s", code, errb)
	}
}

// TestCheckpointModeConfiguration: checkpoint.mode and aligned_timeout of
// the configuration apply to job files that set neither; a job file's own
// win; bad values are usage errors naming the key.
func TestCheckpointModeConfiguration(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	job := "name: j\ncheckpoint: {interval: 1s%s}\noperators:\n  - {uid: gen, source: {type: generator, count: 10}}\n  - {uid: out, sink: {type: discard}, inputs: [gen]}\n"
	must(t, os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(fmt.Sprintf(job, "")), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "own.yaml"), []byte(fmt.Sprintf(job, ", mode: aligned, aligned_timeout: 3s")), 0o644))
	line := func(file string) (int, string, string) {
		t.Helper()
		code, _, out, errb := invoke(t, "validate", file)
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "checkpoint: ") {
				return code, l, errb
			}
		}
		return code, "", errb
	}
	if code, l, errb := line("job.yaml"); code != 0 || !strings.HasSuffix(l, ", aligned)") {
		t.Fatalf("default: exit %d, %q %s", code, l, errb)
	}
	t.Setenv("STREAMD_CHECKPOINT_MODE", "unaligned")
	if code, l, errb := line("job.yaml"); code != 0 || !strings.HasSuffix(l, ", unaligned)") {
		t.Fatalf("configured unaligned: exit %d, %q %s", code, l, errb)
	}
	if code, l, errb := line("own.yaml"); code != 0 || !strings.HasSuffix(l, ", aligned, unaligned after 3s)") {
		t.Fatalf("the job file's own: exit %d, %q %s", code, l, errb)
	}
	t.Setenv("STREAMD_CHECKPOINT_ALIGNED_TIMEOUT", "2s")
	if code, _, errb := line("job.yaml"); code != exitUsage || !strings.Contains(errb, "checkpoint.aligned_timeout: only with checkpoint.mode: aligned") {
		t.Fatalf("timeout with unaligned: exit %d, %s", code, errb)
	}
	t.Setenv("STREAMD_CHECKPOINT_MODE", "aligned")
	if code, l, errb := line("job.yaml"); code != 0 || !strings.HasSuffix(l, ", aligned, unaligned after 2s)") {
		t.Fatalf("configured timeout: exit %d, %q %s", code, l, errb)
	}
	t.Setenv("STREAMD_CHECKPOINT_MODE", "sideways")
	if code, _, errb := line("job.yaml"); code != exitUsage || !strings.Contains(errb, `checkpoint.mode: "sideways": want aligned or unaligned`) {
		t.Fatalf("bad mode: exit %d, %s", code, errb)
	}
}

// TestStateConfiguration: state.backend and state.cache_mib of the
// configuration apply to job files without a state section; a job file's
// own wins; bad values are usage errors naming the key.
func TestStateConfiguration(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	job := "name: j\n%soperators:\n  - {uid: gen, source: {type: generator, count: 10}}\n  - {uid: out, sink: {type: discard}, inputs: [gen]}\n"
	must(t, os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(fmt.Sprintf(job, "")), 0o644))
	must(t, os.WriteFile(filepath.Join(dir, "own.yaml"), []byte(fmt.Sprintf(job, "state: {backend: memory}\n")), 0o644))
	line := func(file string) (int, string, string) {
		t.Helper()
		code, _, out, errb := invoke(t, "validate", file)
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "state: ") {
				return code, l, errb
			}
		}
		return code, "", errb
	}
	if code, l, errb := line("job.yaml"); code != 0 || l != "" {
		t.Fatalf("default (memory): exit %d, %q %s", code, l, errb)
	}
	t.Setenv("STREAMD_STATE_BACKEND", "pebble")
	if code, l, errb := line("job.yaml"); code != 0 || l != "state: pebble (block cache 256 MiB, incremental checkpoints)" {
		t.Fatalf("configured pebble: exit %d, %q %s", code, l, errb)
	}
	t.Setenv("STREAMD_STATE_CACHE_MIB", "64")
	if code, l, errb := line("job.yaml"); code != 0 || l != "state: pebble (block cache 64 MiB, incremental checkpoints)" {
		t.Fatalf("configured cache: exit %d, %q %s", code, l, errb)
	}
	if code, l, errb := line("own.yaml"); code != 0 || l != "" {
		t.Fatalf("the job file's own: exit %d, %q %s", code, l, errb)
	}
	t.Setenv("STREAMD_STATE_CACHE_MIB", "0")
	if code, _, errb := line("job.yaml"); code != exitUsage || !strings.Contains(errb, "state.cache_mib: must be at least 1, got 0") {
		t.Fatalf("bad cache: exit %d, %s", code, errb)
	}
	t.Setenv("STREAMD_STATE_CACHE_MIB", "64")
	t.Setenv("STREAMD_STATE_BACKEND", "rocksdb")
	if code, _, errb := line("job.yaml"); code != exitUsage || !strings.Contains(errb, `state.backend "rocksdb": want memory or pebble`) {
		t.Fatalf("bad backend: exit %d, %s", code, errb)
	}
}

// TestParallelismAtLeastOne: -p 0 (or negative) is a usage error, not
// silently the job's default.
func TestParallelismAtLeastOne(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	must(t, os.WriteFile("job.yaml", []byte("name: j\noperators:\n  - {uid: gen, source: {type: generator, count: 1}}\n  - {uid: out, sink: {type: discard}, inputs: [gen]}\n"), 0o644))
	for _, p := range []string{"0", "-3"} {
		code, _, _, errb := invoke(t, "validate", "-p", p, "job.yaml")
		if code != exitUsage || !strings.Contains(errb, "--parallelism must be at least 1") {
			t.Errorf("-p %s: exit %d, %s", p, code, errb)
		}
	}
	if code, _, _, errb := invoke(t, "validate", "-p", "2", "job.yaml"); code != 0 {
		t.Errorf("-p 2: exit %d, %s", code, errb)
	}
}

// TestFlagUsageNamesNoBackquotedWord: pflag takes a back-quoted word in a
// flag's usage as the name of its value in --help ("--job-retention
// streamd list"), so no flag's usage quotes with back-quotes by accident:
// the value name --help shows is the flag's type or a word chosen for it.
func TestFlagUsageNamesNoBackquotedWord(t *testing.T) {
	var walk func(*cobra.Command)
	walk = func(cmd *cobra.Command) {
		check := func(f *pflag.Flag) {
			if name, _ := pflag.UnquoteUsage(f); strings.ContainsAny(name, " \"'") {
				t.Errorf("%s --%s: --help shows its value as %q", cmd.CommandPath(), f.Name, name)
			}
		}
		cmd.LocalFlags().VisitAll(check)
		cmd.PersistentFlags().VisitAll(check)
		for _, sub := range cmd.Commands() {
			walk(sub)
		}
	}
	walk(newCLI(strings.NewReader(""), io.Discard, io.Discard).rootCommand())
}
