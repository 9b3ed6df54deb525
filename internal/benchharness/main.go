// Command benchharness is `make bench`: it runs the Go benchmarks of the host
// and the runtime in one go, measures cold and cached module compilation in
// fresh processes, prints one table and writes it to BENCHMARKS.md with the
// machine and the date. Ratios are computed within this one run, because the
// machine is shared and noisy and absolute times move between runs.
package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/streamd/streamd/host"
)

// A suite is one `go test -bench` invocation.
type suite struct {
	pkg     string
	pattern string
	// benchtime overrides -benchtime (e.g. "3x" for a benchmark whose every
	// op starts processes).
	benchtime string
	// env is added to the environment of the go test process.
	env []string
}

var suites = []suite{
	{"./host", ".", "", nil},
	{"./internal/runtime", ".", "", nil},
	{"./test/cluster", "^(BenchmarkInProcess|BenchmarkTwoHostsNATS|BenchmarkRawNATSPubSub|BenchmarkTwoHostsVsRawNATS|BenchmarkTwoHostsVsInProcess|BenchmarkTwoHostsGeneratorDiscard|BenchmarkTwoHostsWasmMap)$", "", nil},
	{"./test/cluster", "^BenchmarkHostKillToProcessing$", "3x", nil},
	// The back-pressured unaligned checkpoint in one process and on two
	// hosts, alternating: seconds to tens of seconds per op. Three ops
	// give each side's median 12 checkpoints: with one op (4) the one
	// process's median fell on either of its two modes (a checkpoint
	// waits for one or two of the slow stage's batches), 11 or 23 ms, and
	// the ratio of the medians with it (2.47 and 1.21 on one machine).
	{"./test/cluster", "^BenchmarkUnalignedBackpressureTwoHosts$", "3x", nil},
	{"./internal/checkpoint", "1MKeys", "", nil},
	{"./internal/webapi", "^BenchmarkConsolePolledVsNone$", "3x", nil},
	// State that scales (16M keys on pebble; 100k to 16M keys on both
	// backends): minutes per op, so once, in a suite of its own.
	// Their Go heap is bounded at 60% of the machine's memory (GOMEMLIMIT,
	// unless set): 16M keys on the memory backend peaked at 11.9 GiB RSS
	// in one run and grew to 23 GiB in another, where the OOM killer ended
	// it on a 24 GiB machine (the default GOGC lets the heap reach twice
	// what is live before it collects).
	{"./internal/runtime", "^(BenchmarkPebbleStateCheckpointVsNone|BenchmarkStateScaling|BenchmarkState4MKeysTimersCheckpointVsNone)$", "1x", []string{bigStateEnv + "=1", memLimitEnv(0.6)}},
}

// memLimitEnv returns a GOMEMLIMIT setting of frac of the machine's memory
// (/proc/meminfo), or the one in the environment; "" if neither is known.
func memLimitEnv(frac float64) string {
	if v := os.Getenv("GOMEMLIMIT"); v != "" {
		return "GOMEMLIMIT=" + v
	}
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "MemTotal:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err == nil && kb > 0 {
				return fmt.Sprintf("GOMEMLIMIT=%dMiB", int64(float64(kb)*frac)>>10)
			}
		}
	}
	return ""
}

// bigStateEnv enables the large-state benchmarks (internal/runtime).
const bigStateEnv = "STREAMD_BENCH_BIG_STATE"

type result struct {
	name    string
	metrics map[string]float64 // unit -> value
}

func main() {
	benchtime := flag.String("benchtime", "2s", "go test -benchtime")
	out := flag.String("o", "BENCHMARKS.md", "where to write the table")
	compileOnce := flag.String("compile-once", "", "internal: load this module once and print the seconds it took")
	cacheDir := flag.String("cache-dir", "", "internal: compilation cache for -compile-once")
	nexmarkEvents := flag.Int64("nexmark-events", 1_000_000, "events per Nexmark query run; 0 skips Nexmark")
	flag.Parse()
	if *compileOnce != "" {
		os.Exit(runCompileOnce(*compileOnce, *cacheDir))
	}

	var results []result
	for _, s := range suites {
		rs, err := runSuite(s, *benchtime)
		if err != nil {
			fmt.Fprintf(os.Stderr, "benchharness: %s: %v\n", s.pkg, err)
			os.Exit(1)
		}
		results = append(results, rs...)
	}
	cold, cached, err := compileTimes("examples/wasm/uppercase/uppercase.wasm")
	if err != nil {
		fmt.Fprintf(os.Stderr, "benchharness: compile times: %v\n", err)
		os.Exit(1)
	}
	report := render(results, cold, cached)
	if *nexmarkEvents > 0 {
		nx, err := nexmarkSection(*nexmarkEvents)
		if err != nil {
			fmt.Fprintf(os.Stderr, "benchharness: %v\n", err)
			os.Exit(1)
		}
		report += nx
	}
	fmt.Print(report)
	if err := os.WriteFile(*out, []byte(report), 0o644); err != nil {
		fmt.Fprintf(os.Stderr, "benchharness: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("\nwritten to %s\n", *out)
}

var benchLine = regexp.MustCompile(`^(Benchmark\S+?)(?:-\d+)?\s+(\d+)\s+(.*)$`)

func runSuite(s suite, benchtime string) ([]result, error) {
	if s.benchtime != "" {
		benchtime = s.benchtime
	}
	cmd := exec.Command("go", "test", "-run", "^$", "-bench", s.pattern, "-benchtime", benchtime, "-count", "1", "-timeout", "60m", s.pkg)
	cmd.Env = os.Environ()
	for _, e := range s.env {
		if e != "" {
			cmd.Env = append(cmd.Env, e)
		}
	}
	cmd.Stderr = os.Stderr
	var buf bytes.Buffer
	cmd.Stdout = &buf
	err := cmd.Run()
	os.Stdout.Write(buf.Bytes())
	if err != nil {
		return nil, fmt.Errorf("go test -bench failed: %w", err)
	}
	var rs []result
	sc := bufio.NewScanner(&buf)
	for sc.Scan() {
		m := benchLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		r := result{name: m[1], metrics: map[string]float64{}}
		f := strings.Fields(m[3])
		for i := 0; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err == nil {
				r.metrics[f[i+1]] = v
			}
		}
		if ns, ok := r.metrics["ns/record"]; ok && ns > 0 {
			if _, has := r.metrics["records/s"]; !has {
				r.metrics["records/s"] = 1e9 / ns
			}
		}
		rs = append(rs, r)
	}
	return rs, nil
}

func runCompileOnce(path, cacheDir string) int {
	ctx := context.Background()
	start := time.Now()
	e, err := host.NewEngine(ctx, host.WithCacheDir(cacheDir))
	if err == nil {
		_, err = e.LoadFile(ctx, path)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(time.Since(start).Seconds())
	return 0
}

// compileTimes loads the module in a new process with an empty cache, then in
// another new process with the cache the first one filled.
func compileTimes(module string) (cold, cached float64, err error) {
	dir, err := os.MkdirTemp("", "streamd-bench-cache")
	if err != nil {
		return 0, 0, err
	}
	defer os.RemoveAll(dir)
	self, err := os.Executable()
	if err != nil {
		return 0, 0, err
	}
	abs, _ := filepath.Abs(module)
	run := func() (float64, error) {
		out, err := exec.Command(self, "-compile-once", abs, "-cache-dir", dir).Output()
		if err != nil {
			return 0, fmt.Errorf("%s: %w", module, err)
		}
		return strconv.ParseFloat(strings.TrimSpace(string(out)), 64)
	}
	if cold, err = run(); err != nil {
		return 0, 0, err
	}
	cached, err = run()
	return cold, cached, err
}

func render(results []result, cold, cached float64) string {
	var b strings.Builder
	host, _ := os.Hostname()
	cpu := cpuModel()
	fmt.Fprintf(&b, "# streamd benchmarks\n\n")
	fmt.Fprintf(&b, "Measured %s on %s (%s, %d cores, %s). Regenerate with `make bench`.\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), host, cpu, runtime.NumCPU(), runtime.Version())
	fmt.Fprintf(&b, "The machine is shared and noisy: compare the ratios, which come from one run, not absolute numbers across runs.\n\n")
	fmt.Fprintf(&b, "| benchmark | ns/record | records/s | ns/op | other metrics |\n|---|---:|---:|---:|---|\n")
	for _, r := range results {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", strings.TrimPrefix(r.name, "Benchmark"),
			num(r.metrics["ns/record"]), num(r.metrics["records/s"]), num(r.metrics["ns/op"]), others(r.metrics))
	}
	fmt.Fprintf(&b, "\n## Ratios (same run)\n\n| ratio | value | target |\n|---|---:|---|\n")
	for _, q := range ratios {
		a, okA := find(results, q.num, q.unit)
		d, okD := find(results, q.den, q.unit)
		if !okA || !okD || d == 0 {
			fmt.Fprintf(&b, "| %s | n/a (missing %s or %s) | %s |\n", q.label, q.num, q.den, q.target)
			continue
		}
		fmt.Fprintf(&b, "| %s | %.2f | %s |\n", q.label, a/d, q.target)
	}
	fmt.Fprintf(&b, "\n## Targets, and ratios of benchmarks that alternate both sides (same run)\n\n| what | value | target |\n|---|---:|---|\n")
	for _, q := range values {
		v, ok := find(results, q.bench, q.unit)
		if !ok {
			fmt.Fprintf(&b, "| %s | n/a (missing %s) | %s |\n", q.label, q.bench, q.target)
			continue
		}
		n := num(v)
		if v == 0 {
			n = "0" // a measured zero (none in flight), not a missing value
		}
		fmt.Fprintf(&b, "| %s | %s %s | %s |\n", q.label, n, q.unit, q.target)
	}
	fmt.Fprintf(&b, "| compile cold / cached, new process (uppercase Go guest: %.3fs / %.3fs) | %.1fx | cached at least 10x faster |\n",
		cold, cached, cold/cached)
	renderScaling(&b, results)
	return b.String()
}

// renderScaling writes BenchmarkStateScaling's metrics (BACKEND-SIZE-MiB,
// -s-checkpoint, -s-restore) as a table: how checkpoint and restore cost
// grow with the state.
func renderScaling(b *strings.Builder, results []result) {
	for _, r := range results {
		if r.name != "BenchmarkStateScaling" {
			continue
		}
		var rows []string
		for k := range r.metrics {
			if row, ok := strings.CutSuffix(k, "-s-checkpoint"); ok {
				rows = append(rows, row)
			}
		}
		sort.Slice(rows, func(i, j int) bool {
			bi, si, _ := strings.Cut(rows[i], "-")
			bj, sj, _ := strings.Cut(rows[j], "-")
			if bi != bj {
				return bi < bj
			}
			return sizeOf(si) < sizeOf(sj)
		})
		fmt.Fprintf(b, "\n## State size: checkpoint and restore (BenchmarkStateScaling)\n\n"+
			"A keyed counter writes every key once (100 B of state per key), a checkpoint every 1 s (pebble: incremental). "+
			"Checkpoint: trigger to complete, of the last one while the counter ran. Restore: reading and redistributing that checkpoint plus the subtask's load of its keyed state. "+
			"State: the checkpoint's full size (pebble's sstables are compressed).\n\n"+
			"| backend | keys | state MiB | checkpoint s | restore s |\n|---|---:|---:|---:|---:|\n")
		for _, row := range rows {
			backend, size, _ := strings.Cut(row, "-")
			fmt.Fprintf(b, "| %s | %s | %s | %s | %s |\n", backend, size, num(r.metrics[row+"-MiB"]),
				num(r.metrics[row+"-s-checkpoint"]), num(r.metrics[row+"-s-restore"]))
		}
	}
}

// sizeOf reads 100k or 16M.
func sizeOf(s string) float64 {
	mul := 1.0
	if n, ok := strings.CutSuffix(s, "M"); ok {
		s, mul = n, 1e6
	} else if n, ok := strings.CutSuffix(s, "k"); ok {
		s, mul = n, 1e3
	}
	v, _ := strconv.ParseFloat(s, 64)
	return v * mul
}

type ratio struct {
	label, num, den, unit, target string
}

// ratios lists what the issues ask to be compared; each is computed from two
// benchmarks of this same run. Comparisons that are sensitive to the machine's
// load from one benchmark to the next (pipelines against native, with and
// without checkpoints or tracing, hash against forward) are measured by
// benchmarks that alternate both sides and are read off in values instead.
var ratios = []ratio{
	{"boundary: one call per record / batched call (no-op WAT guest), ns/record", "BenchmarkCallPerRecord/noop-wat", "BenchmarkCallBatched/noop-wat/guard", "ns/record", "batched boundary under 20 ns/record"},
	{"Rust guest map / native Go map, ns/record (batches of 1000 x 100 B)", "BenchmarkCallBatched/uppercase-rust/guard", "BenchmarkNativeGo", "ns/record", "report; Rust >= 1.2M records/s"},
	{"Go guest map / native Go map, ns/record", "BenchmarkCallBatched/uppercase-go/guard", "BenchmarkNativeGo", "ns/record", "report"},
	{"Rust guest map with the guest guard / without, ns/record (CallBatched)", "BenchmarkCallBatched/uppercase-rust/guard", "BenchmarkCallBatched/uppercase-rust/unguarded", "ns/record", "report"},
	{"Go guest map with the guest guard / without, ns/record (CallBatched)", "BenchmarkCallBatched/uppercase-go/guard", "BenchmarkCallBatched/uppercase-go/unguarded", "ns/record", "report"},
	{"Nexmark q0, the guest's part: Go module / Rust module, thread CPU ns/event (batches of 1000 events)", "BenchmarkNexmarkGuest/go/q0", "BenchmarkNexmarkGuest/rust/q0", "cpu-ns/event", "report (q0-go's gap to 5x Flink)"},
	{"Nexmark q2, the guest's part: Go module / Rust module, thread CPU ns/event", "BenchmarkNexmarkGuest/go/q2", "BenchmarkNexmarkGuest/rust/q2", "cpu-ns/event", "report"},
	{"two hosts over NATS loopback / in-process (generator -hash-> uppercase wasm p=2), records/s", "BenchmarkTwoHostsNATS", "BenchmarkInProcess", "records/s", "report"},
}

// value is one metric of one benchmark that an issue sets a target for.
type value struct {
	label, bench, unit, target string
}

var values = []value{
	{"boundary cost of a batched call (no-op WAT guest)", "BenchmarkCallBatched/noop-wat/guard", "ns/record", "< 20 ns/record"},
	{"Rust guest map through the host, one core", "BenchmarkCallBatched/uppercase-rust/guard", "records/s", ">= 1.2M records/s"},
	{"Rust guest pipeline generator -> map -> discard, p=1", "BenchmarkPipelineRustGuest", "records/s", ">= 1M records/s"},
	{"Rust guest pipeline as % of native, back to back in one benchmark", "BenchmarkGuestVsNative", "rust-%-of-native", ">= 40"},
	{"Go guest pipeline as % of native, back to back in one benchmark", "BenchmarkGuestVsNative", "go-%-of-native", "report"},
	{"guest guard on (default) as % of off, Rust map pipeline, alternating in one benchmark", "BenchmarkGuardOnVsOff", "on-%-of-off", ">= 90"},
	{"Go map pipeline with the typed helpers (MapOf(String, String)) as % of the raw byte API (Map), alternating in one benchmark", "BenchmarkTypedVsRaw", "go-typed-%-of-raw", ">= 90"},
	{"Rust map pipeline with the typed helpers (map_view::<Str, Str>: borrowed &str, written into the output frame) as % of the raw byte API (emit_with), alternating", "BenchmarkTypedVsRaw", "rust-typed-%-of-raw", ">= 90"},
	{"Rust map pipeline with map_typed::<Str, Str> (owned String, upper-cased in place) as % of the raw byte API, alternating", "BenchmarkTypedVsRaw", "rust-owned-typed-%-of-raw", "report"},
	{"MapState put and get through the host (mstate WAT guest, batches of 1000, 1000 keys x 16 user keys), memory backend", "BenchmarkMapStatePutGet/memory", "ops/s", "report"},
	{"MapState put and get through the host, pebble backend", "BenchmarkMapStatePutGet/pebble", "ops/s", "report"},
	{"tracing on as % of off, alternating in one benchmark", "BenchmarkTracingOnVsOff", "on-%-of-off", ">= 95"},
	{"checkpoint every 1 s as % of no checkpoints, alternating in one benchmark", "BenchmarkCheckpointVsNone", "1s-%-of-none", ">= 90"},
	{"hash partitioning p=2 as % of forward p=2, alternating in one benchmark", "BenchmarkHashVsForwardP2", "hash-%-of-forward", ">= 70"},
	{"two hosts generator -> discard (100-byte records) as % of raw NATS pub/sub bytes/s (64 KiB messages), alternating", "BenchmarkTwoHostsVsRawNATS", "discard-%-of-raw", ">= 75"},
	{"two hosts generator -> Rust wasm map -> discard as % of raw NATS pub/sub bytes/s, alternating", "BenchmarkTwoHostsVsRawNATS", "wasm-%-of-raw", ">= 75"},
	{"two hosts generator -> Rust wasm map -> discard as % of the same pipeline in one process, alternating", "BenchmarkTwoHostsVsRawNATS", "wasm-%-of-inprocess", ">= 70"},
	{"two hosts generator -hash-> Go uppercase wasm -> discard, p=2 (half the records cross NATS), as % of one process, alternating", "BenchmarkTwoHostsVsInProcess", "twohosts-%-of-inprocess", "report"},
	{"Rust guest pipeline as % of native, GOMAXPROCS 1, alternating", "BenchmarkRustVsNative1Core", "rust-%-of-native", ">= 65"},
	{"latency at 100k records/s, one process (generator -> Rust map -> sink, 1 s checkpoints): p99", "BenchmarkLatency100k", "p99-ms", "<= 3 ms"},
	{"latency at 100k records/s, one process: max", "BenchmarkLatency100k", "max-ms", "<= 25 ms"},
	{"latency at 100k records/s, one process: longest GC pause of the run", "BenchmarkLatency100k", "gc-max-pause-ms", "report"},
	{"Kafka source -> Rust uppercase -> exactly-once Kafka sink (kfake in-process, 4 partitions, 100-byte records, checkpoints every 200 ms) as % of franz-go's own consume/produce loop on the same kfake, in turn in one benchmark", "BenchmarkKafkaPipelineVsRaw", "eos-%-of-raw", ">= 50"},
	{"the same pipeline, exactly-once sink as % of the at-least-once sink", "BenchmarkKafkaPipelineVsRaw", "eos-%-of-alo", ">= 70"},
	{"the same pipeline, at-least-once sink as % of franz-go's loop", "BenchmarkKafkaPipelineVsRaw", "alo-%-of-raw", "report"},
	{"checkpoint of 1M keys of 100-byte state, written to disk", "BenchmarkSnapshot1MKeys", "s/checkpoint", "<= 2 s"},
	{"memory state, 1M keys x 100 B through a keyed wasm counter, checkpoint every 1 s as % of none, alternating", "BenchmarkState1MKeysCheckpointVsNone", "1s-%-of-none", ">= 80"},
	{"memory state, 1M keys: longest synchronous snapshot pause of the keyed subtask", "BenchmarkState1MKeysCheckpointVsNone", "ms-max-sync-pause", "<= 10 ms"},
	{"memory state, 1M keys with a timer per key (wordcount's count.wasm), checkpoint every 1 s as % of none, alternating", "BenchmarkState1MKeysTimersCheckpointVsNone", "1s-%-of-none", ">= 85"},
	{"memory state, 1M keys with a timer per key: longest synchronous snapshot pause of the keyed subtask", "BenchmarkState1MKeysTimersCheckpointVsNone", "ms-max-sync-pause", "<= 20 ms"},
	{"memory state, 4M keys with a timer per key, checkpoint every 1 s as % of none, alternating", "BenchmarkState4MKeysTimersCheckpointVsNone", "1s-%-of-none", ">= 80"},
	{"pebble without checkpoints as % of memory, keyed counter (100k keys), alternating", "BenchmarkStateBackendsNoCheckpoint", "pebble-%-of-memory", ">= 60"},
	{"pebble state, 16M keys x 100 B, 256 MiB cache, incremental checkpoints every 1 s as % of none, alternating", "BenchmarkPebbleStateCheckpointVsNone", "1s-%-of-none", ">= 50"},
	{"pebble state, 16M keys: peak RSS of the benchmark process", "BenchmarkPebbleStateCheckpointVsNone", "MiB-peak-rss", "<= 1024 MiB"},
	{"pebble state, 16M keys, up to 1% of the keys changed per 1 s checkpoint: bytes a checkpoint writes as % of the full state, mean over the run's checkpoints (the compactions' uploads included)", "BenchmarkPebbleStateCheckpointVsNone", "1pct-written-%-of-full-mean", "<= 5"},
	{"pebble state, 16M keys, up to 1% of the keys changed per 1 s checkpoint: the same, median (a checkpoint without a compaction)", "BenchmarkPebbleStateCheckpointVsNone", "1pct-written-%-of-full", "report"},
	{"pebble state, 16M keys: restore of the last checkpoint to its first checkpoint after (includes one 1 s interval)", "BenchmarkPebbleStateCheckpointVsNone", "s-restore-to-first-checkpoint", "report"},
	{"REST API and console polled every second (job list, job, plan, checkpoints) as % of no listener, alternating", "BenchmarkConsolePolledVsNone", "polled-%-of-none", ">= 95"},
	{"restore and redistribute 1M keys to 4 subtasks", "BenchmarkRestore1MKeys", "s/restore", "report"},
	{"failure to processing again, 8 subtasks, modules cached", "BenchmarkFailoverRestart8", "ms/failover", "< 1000 ms"},
	{"host process SIGKILLed to processing again (3 hosts, heartbeat 100 ms, lost after 4, p=4; ms/kill-to-new-attempt in the table)", "BenchmarkHostKillToProcessing", "ms/kill-to-processing", "report"},
	{"end of input to job finished, pipeline depth 1, interval 1h", "BenchmarkFinalCheckpointDepth1", "ms/finish", "< 1000 ms"},
	{"end of input to job finished, pipeline depth 4, interval 1h", "BenchmarkFinalCheckpointDepth4", "ms/finish", "< 1000 ms"},
	{"end of input to job finished, pipeline depth 8, interval 1h", "BenchmarkFinalCheckpointDepth8", "ms/finish", "< 1000 ms"},
	{"back-pressured pipeline (slow stage a tenth of the source's rate, one skewed subtask of 4): aligned checkpoint, trigger to complete", "BenchmarkUnalignedBackpressure", "aligned-ms/checkpoint", "report"},
	{"back-pressured pipeline: unaligned checkpoint, trigger to complete (mean)", "BenchmarkUnalignedBackpressure", "unaligned-ms/checkpoint", "< 1000 ms"},
	{"back-pressured pipeline: slowest unaligned checkpoint of the run", "BenchmarkUnalignedBackpressure", "unaligned-max-ms", "< 1000 ms"},
	{"back-pressured pipeline: unaligned checkpoint duration as % of aligned, alternating in one benchmark", "BenchmarkUnalignedBackpressure", "unaligned-%-of-aligned", "<= 20"},
	{"back-pressured pipeline: in-flight bytes per unaligned checkpoint", "BenchmarkUnalignedBackpressure", "unaligned-inflight-B/checkpoint", "report"},
	{"back-pressured job (generator at 12000/s rebalanced over 2 subtasks of a wasm stage sleeping 500 us a record, batches of 25), unaligned: one process, checkpoint trigger to complete (median)", "BenchmarkUnalignedBackpressureTwoHosts", "one-process-ms-median", "report"},
	{"the same: the slow stage's records/s in one process (back-pressured when far below 12000)", "BenchmarkUnalignedBackpressureTwoHosts", "one-process-slow-records/s", "report"},
	{"the same spread over two hosts (embedded NATS; the slow stage's subtask 1 on the other host): unaligned checkpoint (median)", "BenchmarkUnalignedBackpressureTwoHosts", "two-hosts-ms-median", "< 1000 ms"},
	{"the same on two hosts: slowest unaligned checkpoint of the run", "BenchmarkUnalignedBackpressureTwoHosts", "two-hosts-ms-max", "< 1000 ms"},
	{"the same: two hosts' unaligned checkpoint (median) as a multiple of one process's, alternating", "BenchmarkUnalignedBackpressureTwoHosts", "two-hosts-x-one-process", "<= 2"},
	{"the same on two hosts: in-flight bytes per unaligned checkpoint (median; received over NATS among them)", "BenchmarkUnalignedBackpressureTwoHosts", "two-hosts-inflight-B-median", "report"},
	{"unaligned checkpoints every 500 ms as % of aligned, no back-pressure, alternating in one benchmark", "BenchmarkUnalignedVsAligned", "unaligned-%-of-aligned", ">= 90"},
	{"no back-pressure, 20 KB records (generator -hash-> Rust uppercase -> discard, p=2, checkpoint every 300 ms): the pipeline unthrottled", "BenchmarkUnalignedNoBackpressure", "unthrottled-records/s", "report"},
	{"the same, the source paced at a third of that (at most the issue's 100000/s)", "BenchmarkUnalignedNoBackpressure", "paced-records/s", "report"},
	{"the same paced: aligned checkpoint, trigger to complete, median", "BenchmarkUnalignedNoBackpressure", "aligned-ms-median", "report"},
	{"the same paced: aligned checkpoint, p90", "BenchmarkUnalignedNoBackpressure", "aligned-ms-p90", "report"},
	{"the same paced: unaligned checkpoint, alternating with aligned, median", "BenchmarkUnalignedNoBackpressure", "unaligned-ms-median", "<= 2x aligned + 20 ms + in-flight write (next rows)"},
	{"the same paced: unaligned checkpoint, p90", "BenchmarkUnalignedNoBackpressure", "unaligned-ms-p90", "report"},
	{"the same paced: in-flight bytes per unaligned checkpoint (median)", "BenchmarkUnalignedNoBackpressure", "unaligned-inflight-B-median", "report"},
	{"the same paced: time to write those bytes at the disk speed measured in the run (write + fsync)", "BenchmarkUnalignedNoBackpressure", "inflight-write-ms", "report"},
	{"the same paced: the unaligned target, 2x aligned median + 20 ms + that write", "BenchmarkUnalignedNoBackpressure", "unaligned-target-ms", "report"},
	{"the same paced: unaligned median minus its target", "BenchmarkUnalignedNoBackpressure", "unaligned-over-target-ms", "<= 0 ms"},
	{"end of input to job finished, unaligned, pipeline depth 1, interval 1h", "BenchmarkFinalCheckpointUnalignedDepth1", "ms/finish", "< 1000 ms"},
	{"end of input to job finished, unaligned, pipeline depth 4, interval 1h", "BenchmarkFinalCheckpointUnalignedDepth4", "ms/finish", "< 1000 ms"},
	{"end of input to job finished, unaligned, pipeline depth 8, interval 1h", "BenchmarkFinalCheckpointUnalignedDepth8", "ms/finish", "< 1000 ms"},
}

// others formats the metrics that have no column of their own.
func others(m map[string]float64) string {
	var keys []string
	for k := range m {
		switch k {
		case "ns/record", "records/s", "ns/op", "B/op", "allocs/op", "MB/s":
			continue
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, num(m[k])+" "+k)
	}
	return strings.Join(parts, ", ")
}

func find(rs []result, name, unit string) (float64, bool) {
	for _, r := range rs {
		if r.name == name {
			v, ok := r.metrics[unit]
			return v, ok
		}
	}
	return 0, false
}

func num(v float64) string {
	switch {
	case v == 0:
		return ""
	case v >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case v >= 1000:
		return fmt.Sprintf("%.0f", v)
	default:
		return fmt.Sprintf("%.3g", v)
	}
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "model name") {
			if i := strings.Index(line, ":"); i >= 0 {
				return strings.TrimSpace(line[i+1:])
			}
		}
	}
	return runtime.GOARCH
}
