//go:build long

package cluster_test

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/streamd/streamd/internal/cluster/client"
	"github.com/streamd/streamd/internal/cluster/wire"
	"github.com/streamd/streamd/internal/jobfile"
	"github.com/streamd/streamd/internal/natsutil"
	"github.com/streamd/streamd/internal/testwasm"
)

// chaosProc is a process a chaos test kills with SIGKILL and starts again
// with the same arguments (same port, data and store directories).
type chaosProc struct {
	t    *testing.T
	name string
	bin  string
	args []string
	cmd  *exec.Cmd
	out  *lockedBuffer
	done chan struct{}
}

func newChaosProc(t *testing.T, name, bin string, args ...string) *chaosProc {
	p := &chaosProc{t: t, name: name, bin: bin, args: args, out: &lockedBuffer{}}
	p.start()
	t.Cleanup(func() {
		before := p.out.String()
		if t.Failed() && bin != natsServerBin(t) {
			// A failed run ends each streamd process with SIGQUIT: its whole
			// output (STREAMD_CHAOS_LOGS) then ends with the stack of every
			// goroutine, which shows where a stalled one waits.
			p.signal(syscall.SIGQUIT)
		}
		p.stop()
		if t.Failed() {
			s := p.out.String()
			t.Logf("%s output (last 6 KiB):\n%s", name, before[max(0, len(before)-6<<10):])
			// The whole output of each process, its goroutines' stacks
			// included, is kept in STREAMD_CHAOS_LOGS=dir, or else in a
			// directory of the system's temp dir that the test names.
			if dir := chaosLogDir(t); dir != "" {
				f := filepath.Join(dir, strings.ReplaceAll(name, " ", "-")+".log")
				if err := os.WriteFile(f, []byte(s), 0o644); err != nil {
					t.Log(err)
				}
			}
		}
	})
	return p
}

// unansweredStatus logs, when a status request went unanswered, the
// client connection's state, whether a status over a new connection is
// answered, and keeps the NATS server's connections and subscriptions
// (its monitoring endpoints) in the test's log directory.
func unansweredStatus(t *testing.T, nc *nats.Conn, url string, monitor int) {
	st := nc.Stats()
	t.Logf("%s: client connection: %v, url %s, %d reconnects, in %d msgs, out %d msgs, buffered %d",
		time.Now().Format("15:04:05.000"), nc.Status(), nc.ConnectedUrl(), nc.Reconnects, st.InMsgs, st.OutMsgs, bufferedOf(nc))
	if fresh, err := natsutil.Connect(natsutil.URLs(url)); err != nil {
		t.Logf("new connection: %v", err)
	} else {
		c, err := client.NewClient(fresh)
		if err == nil {
			c.LeaderWait = 3 * time.Second
			_, err = c.Hosts(context.Background())
		}
		t.Logf("%s: hosts over a new connection: err %v", time.Now().Format("15:04:05.000"), err)
		fresh.Close()
	}
	dir := chaosLogDir(t)
	if dir == "" {
		return
	}
	for name, path := range map[string]string{"connz": "/connz?subs=detail", "subsz": "/subsz?subs=1&limit=100000"} {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d%s", monitor, path))
		if err != nil {
			t.Logf("nats monitor %s: %v", path, err)
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		_ = os.WriteFile(filepath.Join(dir, "nats-"+name+".json"), b, 0o644)
	}
}

func bufferedOf(nc *nats.Conn) int {
	n, err := nc.Buffered()
	if err != nil {
		return -1
	}
	return n
}

// chaosLogDirs is the directory of each failed test's process logs.
var chaosLogDirs sync.Map // *testing.T -> string

// chaosLogDir is where the processes of failed test t leave their whole
// output: STREAMD_CHAOS_LOGS, or a new directory in the system's temp dir,
// made and named in the test's log on first use ("": none could be made).
func chaosLogDir(t *testing.T) string {
	if dir := os.Getenv("STREAMD_CHAOS_LOGS"); dir != "" {
		return dir
	}
	if dir, ok := chaosLogDirs.Load(t); ok {
		return dir.(string)
	}
	dir, err := os.MkdirTemp("", "streamd-chaos-logs-")
	if err != nil {
		t.Log(err)
		dir = ""
	} else {
		t.Logf("the processes' whole output, with their goroutines' stacks: %s", dir)
	}
	chaosLogDirs.Store(t, dir)
	return dir
}

func (p *chaosProc) start() {
	p.cmd = exec.Command(p.bin, p.args...)
	p.cmd.Dir = p.t.TempDir()
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	fmt.Fprintf(p.out, "---- %s start\n", time.Now().Format(time.TimeOnly))
	if err := p.cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	done, cmd := make(chan struct{}), p.cmd
	p.done = done
	go func() { cmd.Wait(); close(done) }()
}

func (p *chaosProc) kill() {
	fmt.Fprintf(p.out, "---- %s SIGKILL\n", time.Now().Format(time.TimeOnly))
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		p.t.Fatal(err)
	}
	<-p.done
}

// signal sends sig and waits up to 10 s for the process to end.
func (p *chaosProc) signal(sig os.Signal) {
	select {
	case <-p.done:
		return
	default:
	}
	fmt.Fprintf(p.out, "---- %s %v\n", time.Now().Format(time.TimeOnly), sig)
	p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
	}
}

func (p *chaosProc) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(os.Interrupt)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// TestChaos runs 20 rounds against a standalone nats-server process, two
// `streamd controller` processes (leader and standby) and three `streamd
// host` processes of 2 slots. Each round deploys two jobs declared at
// parallelism 3 (min_parallelism 1) with checkpoints in the JetStream
// object store, generator -hash-> uppercase -> nats sink and generator
// -rebalance-> uppercase -> file sink, and once both have completed a
// checkpoint kills one of the leading controller, a host running them and
// the NATS server with SIGKILL, at random (STREAMD_CHAOS_SEED repeats a
// run), and starts it again: both jobs finish and their output holds every
// record exactly once, every round. In the rounds of loseFor the host is
// not started again: the jobs it ran go on at a lower parallelism on the 4
// slots left (the adaptive scheduler), and so do the next rounds' jobs,
// until the round of joinAt, where it joins again while they run: those
// below their declared parallelism scale back up to it.
func TestChaos(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("STREAMD_CHAOS_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("STREAMD_CHAOS_SEED: %v", err)
		}
	}
	t.Logf("seed %d (STREAMD_CHAOS_SEED=%d repeats this run)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 0))

	port, monitor := freePort(t), freePort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	natsProc := newChaosProc(t, "nats-server", natsServerBin(t), "-a", "127.0.0.1", "-p", fmt.Sprint(port), "-m", fmt.Sprint(monitor),
		"-js", "-sd", t.TempDir(), "-n", "chaos")
	waitJetStream(t, url)
	hb := "--heartbeat-interval=100ms"
	ctls := map[string]*chaosProc{}
	for _, id := range []string{"c1", "c2"} {
		ctls[id] = newChaosProc(t, "controller "+id, streamdBin(t), "controller", "--nats", url, hb, "--lost-after="+procLostAfter, "--controller-id", id,
			"--slot-wait="+slotWait.String(), "--rescale-interval="+rescaleInterval.String())
	}
	hosts := map[string]*chaosProc{}
	for i := 1; i <= 3; i++ {
		id := fmt.Sprintf("h%d", i)
		hosts[id] = newChaosProc(t, "host "+id, streamdBin(t), "host", "--nats", url, hb, "--host-id", id, "--slots", "2", "--data-dir", t.TempDir())
	}
	clientNC := connect(t, url)
	client, err := client.NewClient(clientNC)
	if err != nil {
		t.Fatal(err)
	}
	tc := &testCluster{t: t, client: client}
	// A status nobody answered: the controllers' stacks now show where it
	// waits (their whole output is kept, chaosLogDir), and what the client
	// connection, a new one and the NATS server say of it.
	tc.beforeFatal = func() {
		unansweredStatus(t, clientNC, url, monitor) // while the controllers run
		for _, p := range ctls {
			p.signal(syscall.SIGQUIT)
		}
	}
	tc.waitHosts(3)
	js, err := jetstream.New(connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	upper := testwasm.Path(t, "examples/wasm/uppercase/uppercase.wasm")

	const rounds, n = 20, 3000
	// A host is lost for good in the rounds of loseFor, and joins again in
	// the later rounds of joinAt (down, until then).
	loseFor, joinAt := map[int]bool{5: true, 13: true}, map[int]bool{7: true, 15: true}
	var down string
	kills := map[string]int{}
	for r := 1; r <= rounds; r++ {
		rate := 1000 // records/s over all subtasks: 3s a job
		if loseFor[r] || joinAt[r] {
			rate = 150 // 20s: both jobs still run when the lost host's fail over, or when they scaled up after the join
		}
		dir := t.TempDir()
		stream, subject := fmt.Sprintf("OUT%d", r), fmt.Sprintf("out%d.upper", r)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{fmt.Sprintf("out%d.>", r)}, AllowAtomicPublish: true})
		cancel()
		if err != nil {
			t.Fatalf("round %d: create stream %s: %v", r, stream, err)
		}
		common := fmt.Sprintf(`parallelism: 3
min_parallelism: 1
checkpoint: {interval: 100ms, storage: jetstream}
restart: {strategy: fixed-delay, attempts: 100, delay: 200ms}
operators:
  - uid: gen
    source: {type: generator, count: %d, rate: %d, keys: 100}
  - uid: upper
    wasm: %s
    inputs: [{from: gen, partition: %%s}]
  - uid: out
`, n, rate, upper)
		natsJob := filepath.Join(dir, "nats.yaml")
		writeFile(t, natsJob, "name: chaos-nats\n"+fmt.Sprintf(common, "hash")+fmt.Sprintf("    sink: {type: nats, subject: %s}\n    inputs: [upper]\n", subject))
		fileJob := filepath.Join(dir, "file.yaml")
		writeFile(t, fileJob, "name: chaos-file\n"+fmt.Sprintf(common, "rebalance")+"    sink: {type: file, path: out/}\n    inputs: [upper]\n")
		ids := []string{deploy(t, tc, natsJob, jobfile.Options{}), deploy(t, tc, fileJob, jobfile.Options{})}

		// Both running with a completed checkpoint, then one kill.
		var running []*wire.JobStatus
		for _, id := range ids {
			running = append(running, tc.waitJob(id, "a completed checkpoint", func(st *wire.JobStatus) bool {
				return wire.TerminalJobState(st.State) || st.State == wire.JobRunning && len(st.Checkpoints) > 0
			}))
		}
		victim := []string{"leader", "host", "nats"}[rng.IntN(3)]
		switch {
		case loseFor[r] && down == "":
			victim = "host for good"
		case joinAt[r] && down != "":
			victim = "join"
		}
		what := victim
		// shrink: a job must run below its declared parallelism after the
		// kill; grow: the jobs that must scale back up to it after the join.
		var shrink bool
		var grow [2]bool
		switch victim {
		case "leader":
			leader := running[0].Leader
			p := ctls[leader]
			if p == nil {
				t.Fatalf("round %d: the leader %q is none of the controllers", r, leader)
			}
			p.kill()
			// The standby takes over (list answers from it), then the
			// killed one comes back as the standby.
			deadline := time.Now().Add(20 * time.Second)
			for {
				st, err := client.Status(context.Background(), ids[0])
				if err == nil && st.Leader != "" && st.Leader != leader {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("round %d: no controller took over from %s within 20s (last error %v)", r, leader, err)
				}
				time.Sleep(20 * time.Millisecond)
			}
			p.start()
			what = "leader " + leader
		case "host":
			hs := running[rng.IntN(2)].Hosts
			if len(hs) == 0 {
				t.Fatalf("round %d: the running job lists no host", r)
			}
			id := hs[rng.IntN(len(hs))]
			hosts[id].kill()
			if rng.IntN(2) == 0 {
				// Back only once the controller counted it lost.
				deadline := time.Now().Add(20 * time.Second)
				for lost := false; !lost; time.Sleep(20 * time.Millisecond) {
					all, err := client.Hosts(context.Background())
					for _, h := range all {
						lost = lost || err == nil && h.ID == id && h.State == "lost"
					}
					if time.Now().After(deadline) {
						t.Fatalf("round %d: host %s not lost within 20s", r, id)
					}
				}
				what = "host " + id + " (restarted once lost)"
			} else {
				what = "host " + id + " (restarted at once)"
			}
			hosts[id].start()
		case "host for good":
			hs := running[rng.IntN(2)].Hosts
			if len(hs) == 0 {
				t.Fatalf("round %d: the running job lists no host", r)
			}
			down = hs[rng.IntN(len(hs))]
			hosts[down].kill()
			// Both jobs run when the loss fails over those on it: on the 4
			// slots left, one of them at least runs below its declared 3.
			shrink = true
			what = "host " + down + " (not started again)"
		case "join":
			// 4 slots for two jobs declared at 3: one runs below it at least.
			for i, st := range running {
				grow[i] = st.State == wire.JobRunning && st.Parallelism < st.DeclaredParallelism
			}
			if !grow[0] && !grow[1] {
				t.Fatalf("round %d: on the 4 slots left, jobs at parallelism %d and %d (declared %d and %d): want one below its declared",
					r, running[0].Parallelism, running[1].Parallelism, running[0].DeclaredParallelism, running[1].DeclaredParallelism)
			}
			hosts[down].start()
			for i, id := range ids {
				if !grow[i] {
					continue
				}
				st := tc.waitJob(id, "back at its declared parallelism", func(st *wire.JobStatus) bool {
					return wire.TerminalJobState(st.State) || st.State == wire.JobRunning && st.Parallelism == st.DeclaredParallelism
				})
				if st.State != wire.JobRunning {
					t.Fatalf("round %d, after host %s joined: job %s %s before it scaled up (%s): make it longer", r, down, id, st.State, st.Reason)
				}
			}
			what = "none; host " + down + " joined"
			down = ""
		case "nats":
			natsProc.kill()
			natsProc.start()
			waitJetStream(t, url)
		}
		kills[victim]++
		for i, id := range ids {
			st := tc.waitJob(id, "finished", state(wire.JobFinished))
			if st.State != wire.JobFinished {
				t.Fatalf("round %d, after killing %s: job %s %s: %s", r, what, id, st.State, st.Reason)
			}
			running[i] = st
			if grow[i] && !scaled(st, false) {
				t.Errorf("round %d, after a host joined: job %s never scaled up (rescales %+v)", r, id, st.Rescales)
			}
		}
		if shrink && !scaled(running[0], true) && !scaled(running[1], true) {
			t.Errorf("round %d, after losing host %s for good: no job ran below its declared parallelism (rescales %v, %v)", r, down, rescales(running[0]), rescales(running[1]))
		}
		checkStream(t, js, stream, n)
		exactlyOnce(t, filepath.Join(dir, "out"), n)
		t.Logf("round %d: killed %s; nats job in attempt %d, file job in attempt %d (rescales %v, %v); both exactly once",
			r, what, running[0].Attempt, running[1].Attempt, rescales(running[0]), rescales(running[1]))
	}
	t.Logf("%d rounds, kills: %v", rounds, kills)
}

// scaled reports whether the job was rescaled down (else up).
func scaled(st *wire.JobStatus, down bool) bool {
	return slices.ContainsFunc(st.Rescales, func(x wire.RescaleStatus) bool { return x.To < x.From == down })
}

// rescales are a job's rescales as "from->to".
func rescales(st *wire.JobStatus) []string {
	var out []string
	for _, x := range st.Rescales {
		out = append(out, fmt.Sprintf("%d->%d", x.From, x.To))
	}
	return out
}
