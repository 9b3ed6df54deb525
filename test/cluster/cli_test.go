package cluster_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/testwasm"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testwasm.RemoveBuilt()
	os.Exit(code)
}

// streamdBin builds cmd/streamd once per test process and returns its path.
func streamdBin(t testing.TB) string {
	t.Helper()
	return testwasm.Streamd(t)
}

func freePort(t testing.TB) int {
	t.Helper()
	// A port from below the kernel's ephemeral range: a port the kernel
	// hands out (":0") may be taken, before the server binds it, as the
	// local port of an outgoing connection (a NATS node routing to the
	// others took the route port of one not started yet: "bind: address
	// already in use").
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil {
				low = v
			}
		}
	}
	portsMu.Lock()
	defer portsMu.Unlock()
	if low > 12000 {
		for range 100 {
			p := 10000 + rand.IntN(low-10000)
			if portsGiven[p] {
				continue
			}
			if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p)); err == nil {
				l.Close()
				portsGiven[p] = true
				return p
			}
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// portsGiven are the ports freePort returned in this process.
var (
	portsMu    sync.Mutex
	portsGiven = map[int]bool{}
)

// server runs `streamd server` until the test ends; env is added to its
// environment. It returns the NATS URL once the server answers `streamd hosts`.
func startServer(t *testing.T, env []string, args ...string) string {
	t.Helper()
	port := freePort(t)
	dir := t.TempDir()
	cmd := exec.Command(streamdBin(t), append([]string{"server", "--nats-port", fmt.Sprint(port), "--data-dir", filepath.Join(dir, "data"),
		"--slots", "2", "--heartbeat-interval", "100ms"}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.Stdout = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
			t.Errorf("streamd server did not stop within 10s of SIGINT")
		}
		if t.Failed() {
			t.Logf("streamd server output:\n%s", stderr.String())
		}
	})
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	deadline := time.Now().Add(20 * time.Second)
	for {
		out, _, code := streamd(t, append(env, "STREAMD_NATS_URL="+url), "hosts", "--json")
		var hs []wire.HostStatus
		if code == 0 && json.Unmarshal([]byte(out), &hs) == nil && len(hs) == 1 {
			return url
		}
		if time.Now().After(deadline) {
			t.Fatalf("streamd server not ready after 20s; last `streamd hosts`: %d %s", code, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// streamd runs the binary and returns stdout, stderr and the exit status.
func streamd(t *testing.T, env []string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(streamdBin(t), args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

func TestBinaryServerDeployStatus(t *testing.T) {
	url := startServer(t, nil)
	env := []string{"STREAMD_NATS_URL=" + url}
	path := uppercaseJob(t)
	out, errs, code := streamd(t, env, "deploy", path)
	if code != 0 {
		t.Fatalf("deploy: exit %d: %s", code, errs)
	}
	id := strings.TrimSpace(out)
	if !strings.HasPrefix(id, "uppercase-") {
		t.Fatalf("deploy printed %q, want a job id", out)
	}
	var st wire.JobStatus
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, errs, code = streamd(t, env, "status", "--json", id)
		if code != 0 {
			t.Fatalf("status: exit %d: %s", code, errs)
		}
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Fatalf("status --json: %v\n%s", err, out)
		}
		if wire.TerminalJobState(st.State) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("job not done after 30s: %s", out)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if st.State != wire.JobFinished {
		t.Fatalf("job %s: %s", st.State, st.Reason)
	}
	if got, want := readFile(t, filepath.Join(filepath.Dir(path), "out", "part-"+id+"-0")), expected(t); got != want {
		t.Fatalf("output:\n%s\nwant:\n%s", got, want)
	}
	out, _, code = streamd(t, env, "list")
	if code != 0 || !strings.Contains(out, id) || !strings.Contains(out, "finished") {
		t.Fatalf("list: exit %d:\n%s", code, out)
	}
	_, errs, code = streamd(t, env, "savepoint", id)
	if code != 1 || !strings.Contains(errs, "streamd: ") || !strings.Contains(errs, "not running") {
		t.Errorf("savepoint of a finished job: exit %d: %s", code, errs)
	}
	_, errs, code = streamd(t, env, "status", "nosuchjob")
	if code != 1 || !strings.Contains(errs, `no job "nosuchjob"`) {
		t.Errorf("status of an unknown job: exit %d: %s", code, errs)
	}

	// A module deployed as a filter with --wait.
	wasm := filepath.Join(filepath.Dir(path), "uppercase.wasm")
	outDir := filepath.Join(t.TempDir(), "out")
	out, errs, code = streamd(t, env, "deploy", wasm, "--source", "generator:20", "--sink", "file:"+outDir, "--wait", "--json")
	if code != 0 {
		t.Fatalf("deploy --wait: exit %d: %s", code, errs)
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil || st.State != wire.JobFinished {
		t.Fatalf("deploy --wait --json: %v %s", err, out)
	}
	if lines := strings.Count(readFile(t, filepath.Join(outDir, "part-"+st.ID+"-0")), "\n"); lines != 20 {
		t.Errorf("filter output: %d lines, want 20", lines)
	}
	// deploy --json says id, as status and list do, and job_id (deprecated) alike.
	out, errs, code = streamd(t, env, "deploy", "--json", path)
	var dep map[string]string
	if code != 0 || json.Unmarshal([]byte(out), &dep) != nil || !strings.HasPrefix(dep["id"], "uppercase-") || dep["job_id"] != dep["id"] {
		t.Fatalf("deploy --json: exit %d: %s %s", code, out, errs)
	}
	out, _, _ = streamd(t, env, "list", "--json")
	if !strings.Contains(out, `"id": "`+dep["id"]+`"`) {
		t.Errorf("list --json lacks \"id\": %q:\n%s", dep["id"], out)
	}
	_, errs, code = streamd(t, env, "deploy", wasm)
	if code != 2 || !strings.Contains(errs, "--source is required") {
		t.Errorf("deploy of a module without --source: exit %d: %s", code, errs)
	}
}

func TestBinaryCredentials(t *testing.T) {
	url := startServer(t, []string{"STREAMD_NATS_USER=alice", "STREAMD_NATS_PASSWORD=s3cret"})
	_, errs, code := streamd(t, []string{"STREAMD_NATS_URL=" + url}, "list", "--nats-user", "alice", "--nats-password", "wrong")
	if code != 1 || !strings.Contains(errs, "refused the credentials") || !strings.Contains(errs, `user "alice"`) ||
		!strings.Contains(strings.ToLower(errs), "authorization violation") {
		t.Fatalf("wrong password: exit %d: %s", code, errs)
	}
	_, errs, code = streamd(t, []string{"STREAMD_NATS_URL=" + url}, "list")
	if code != 1 || !strings.Contains(errs, "refused the credentials") || !strings.Contains(errs, "no credentials") {
		t.Fatalf("no credentials: exit %d: %s", code, errs)
	}
	out, errs, code := streamd(t, []string{"STREAMD_NATS_URL=" + url, "STREAMD_NATS_USER=alice", "STREAMD_NATS_PASSWORD=s3cret"}, "list", "--json")
	if code != 0 || strings.TrimSpace(out) != "[]" {
		t.Fatalf("right password: exit %d: %s %s", code, out, errs)
	}
	// The configuration file is the lowest layer: streamd.yaml in the working directory.
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "cfg.yaml"), []byte("nats:\n  url: "+url+"\n  user: alice\n  password: s3cret\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, errs, code = streamd(t, nil, "--config-file", filepath.Join(dir, "cfg.yaml"), "list")
	if code != 0 {
		t.Fatalf("credentials from the config file: exit %d: %s", code, errs)
	}
	_, errs, code = streamd(t, []string{"STREAMD_NATS_PASSWORD=wrong"}, "--config-file", filepath.Join(dir, "cfg.yaml"), "list")
	if code != 1 || !strings.Contains(errs, "refused the credentials") {
		t.Fatalf("environment over file: exit %d: %s", code, errs)
	}
}

// foreverJob writes a job file whose generator never ends.
func foreverJob(t *testing.T) string {
	t.Helper()
	dir := filepath.Dir(uppercaseJob(t))
	job := `name: forever
operators:
  - uid: gen
    source: {type: generator, rate: 200}
  - uid: upper
    wasm: uppercase.wasm
    inputs: [gen]
  - uid: out
    sink: {type: discard}
    inputs: [upper]
`
	path := filepath.Join(dir, "forever.yaml")
	if err := os.WriteFile(path, []byte(job), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// startStreamd starts the binary and returns it with its stderr as lines.
func startStreamd(t *testing.T, env []string, stdout *bytes.Buffer, args ...string) (*exec.Cmd, <-chan string) {
	t.Helper()
	cmd := exec.Command(streamdBin(t), args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout = stdout
	pr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 100)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd, lines
}

// waitLine returns the first line of lines that contains want (and all lines read).
func waitLine(t *testing.T, lines <-chan string, want string, seen *[]string) string {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("stderr ended without a line containing %q:\n%s", want, strings.Join(*seen, "\n"))
			}
			*seen = append(*seen, l)
			if strings.Contains(l, want) {
				return l
			}
		case <-timeout:
			t.Fatalf("no line containing %q after 30s:\n%s", want, strings.Join(*seen, "\n"))
		}
	}
}

// TestBinaryDeployWaitDetaches: deploy --wait --json says the id at once
// on stderr and the job's progress; Ctrl-C detaches, and the job goes on.
func TestBinaryDeployWaitDetaches(t *testing.T) {
	url := startServer(t, nil)
	env := []string{"STREAMD_NATS_URL=" + url}
	var stdout bytes.Buffer
	cmd, lines := startStreamd(t, env, &stdout, "deploy", "--wait", "--json", foreverJob(t))
	var seen []string
	first := waitLine(t, lines, "deployed", &seen)
	id := strings.Fields(strings.TrimPrefix(first, "job "))[0]
	if !strings.HasPrefix(id, "forever-") {
		t.Fatalf("first line %q names no job id", first)
	}
	waitLine(t, lines, "job "+id+": running", &seen)
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	detach := waitLine(t, lines, "keeps running", &seen)
	for range lines {
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("deploy --wait after Ctrl-C: %v, want exit 0\n%s", err, strings.Join(seen, "\n"))
	}
	if !strings.Contains(detach, id) || !strings.Contains(detach, "streamd cancel "+id) {
		t.Errorf("detach line %q lacks the id or how to cancel", detach)
	}
	if stdout.Len() != 0 {
		t.Errorf("stdout after detaching: %q, want nothing", stdout.String())
	}
	out, errs, code := streamd(t, env, "status", "--json", id)
	var st wire.JobStatus
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil || st.State != wire.JobRunning {
		t.Fatalf("status after detaching: exit %d: %s %s", code, out, errs)
	}
	if _, errs, code := streamd(t, env, "cancel", id); code != 0 {
		t.Fatalf("cancel: exit %d: %s", code, errs)
	}
}

// TestBinarySavepointDir: savepoint and stop name the savepoint directory
// --savepoint-dir; savepoint's old --dir still works.
func TestBinarySavepointDir(t *testing.T) {
	url := startServer(t, nil)
	env := []string{"STREAMD_NATS_URL=" + url}
	path := foreverJob(t)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b = []byte(strings.Replace(string(b), "operators:", "checkpoint: {interval: 1s, dir: checkpoints/}\noperators:", 1))
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	out, errs, code := streamd(t, env, "deploy", path)
	if code != 0 {
		t.Fatalf("deploy: exit %d: %s", code, errs)
	}
	id := strings.TrimSpace(out)
	waitRunning(t, env, id)
	base := t.TempDir()
	for _, c := range [][]string{
		{"savepoint", "--savepoint-dir", filepath.Join(base, "a"), id},
		{"savepoint", "--dir", filepath.Join(base, "b"), id},
		{"stop", "--savepoint-dir", filepath.Join(base, "c"), id},
	} {
		out, errs, code := streamd(t, env, c...)
		sp := strings.TrimSpace(out)
		if code != 0 || filepath.Dir(sp) != c[2] {
			t.Fatalf("streamd %s: exit %d: %q, want a savepoint in %s\n%s", strings.Join(c, " "), code, sp, c[2], errs)
		}
		if _, err := os.Stat(filepath.Join(sp, "_metadata")); err != nil {
			t.Fatalf("streamd %s: %v", strings.Join(c, " "), err)
		}
	}
}

// waitRunning waits until `streamd status` says the job runs.
func waitRunning(t *testing.T, env []string, id string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, errs, code := streamd(t, env, "status", "--json", id)
		var st wire.JobStatus
		if code != 0 || json.Unmarshal([]byte(out), &st) != nil {
			t.Fatalf("status: exit %d: %s %s", code, out, errs)
		}
		if st.State == wire.JobRunning {
			return
		}
		if wire.TerminalJobState(st.State) || time.Now().After(deadline) {
			t.Fatalf("job %s: %s (%s), want running", id, st.State, st.Reason)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestBinaryFailedJobMessage: deploy --wait of a failing job says why once,
// with the streamd: prefix once.
func TestBinaryFailedJobMessage(t *testing.T) {
	url := startServer(t, nil)
	env := []string{"STREAMD_NATS_URL=" + url}
	path := testwasm.FailingJob(t, t.TempDir())
	_, errs, code := streamd(t, env, "deploy", "--wait", path)
	if code != 1 {
		t.Fatalf("deploy --wait of a failing job: exit %d, want 1:\n%s", code, errs)
	}
	for what, n := range map[string]int{"streamd: ": 1, "conformance panic": 1, `operator "boom"`: 1} {
		if got := strings.Count(errs, what); got != n {
			t.Errorf("%q %d times, want %d:\n%s", what, got, n, errs)
		}
	}
	if !strings.Contains(errs, "streamd: job failing-") || !strings.Contains(errs, " failed: ") {
		t.Errorf("no \"streamd: job ... failed: \" line:\n%s", errs)
	}
	out, _, _ := streamd(t, env, "list", "--json")
	if strings.Contains(out, "streamd: ") {
		t.Errorf("a reason in list --json repeats the streamd: prefix:\n%s", out)
	}
}

// TestBinaryDeleteJob: a finished job leaves `streamd list` after
// --job-retention (list --all and status still show it); `streamd delete
// --checkpoints` removes its record and its checkpoint directory.
func TestBinaryDeleteJob(t *testing.T) {
	url := startServer(t, nil, "--job-retention", "300ms")
	env := []string{"STREAMD_NATS_URL=" + url}
	path := uppercaseJob(t)
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("checkpoint: {interval: 1h, dir: ckpts}\n"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	out, errs, code := streamd(t, env, "deploy", "--wait", "--json", path)
	var st wire.JobStatus
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil || st.State != wire.JobFinished {
		t.Fatalf("deploy --wait: exit %d: %s %s", code, out, errs)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		out, errs, code = streamd(t, env, "list")
		if code != 0 {
			t.Fatalf("list: exit %d: %s", code, errs)
		}
		if !strings.Contains(out, st.ID) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("finished job still listed 20s after it ended (retention 300ms):\n%s", out)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if out, _, _ = streamd(t, env, "list", "--all"); !strings.Contains(out, st.ID) {
		t.Fatalf("list --all lacks %s:\n%s", st.ID, out)
	}
	if _, errs, code = streamd(t, env, "status", st.ID); code != 0 {
		t.Fatalf("status of the hidden job: exit %d: %s", code, errs)
	}
	ck := filepath.Join(filepath.Dir(path), "ckpts", st.ID)
	if err := os.MkdirAll(ck, 0o755); err != nil {
		t.Fatal(err)
	}
	out, errs, code = streamd(t, env, "delete", "--checkpoints", st.ID)
	if code != 0 || !strings.Contains(out, "deleted") {
		t.Fatalf("delete --checkpoints: exit %d: %s %s", code, out, errs)
	}
	if _, err := os.Stat(ck); !os.IsNotExist(err) {
		t.Errorf("checkpoint directory %s after delete --checkpoints: %v, want gone", ck, err)
	}
	if out, _, _ = streamd(t, env, "list", "--all"); strings.Contains(out, st.ID) {
		t.Errorf("list --all after delete still shows %s:\n%s", st.ID, out)
	}
	if _, errs, code = streamd(t, env, "delete", st.ID); code != 1 || !strings.Contains(errs, "no job") {
		t.Errorf("delete of a deleted job: exit %d: %s", code, errs)
	}
}

// TestServerBusyPorts: streamd server on a NATS port or an --http address
// that another process holds exits 1 at once, saying the address is in use,
// and never says it is ready.
func TestServerBusyPorts(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	addr := busy.Addr().String()
	port := busy.Addr().(*net.TCPAddr).Port
	for _, tt := range []struct {
		name string
		args []string
	}{
		{"nats", []string{"--nats-port", fmt.Sprint(port)}},
		{"http", []string{"--nats-port", fmt.Sprint(freePort(t)), "--http", addr}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			out, errs, code := streamd(t, nil, append([]string{"server", "--data-dir", t.TempDir()}, tt.args...)...)
			if code != 1 || !strings.Contains(errs, addr+" is in use by another process") || strings.Contains(errs+out, "server ready") {
				t.Fatalf("streamd server %v: exit %d after %s\nstdout: %s\nstderr: %s\nwant exit 1, %q, no \"server ready\"",
					tt.args, code, time.Since(start).Round(time.Millisecond), out, errs, addr+" is in use by another process")
			}
			t.Logf("exit %d after %s: %s", code, time.Since(start).Round(time.Millisecond), strings.TrimSpace(errs))
		})
	}
}
