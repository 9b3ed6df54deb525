package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/streamd/streamd/internal/natsutil"
	"github.com/streamd/streamd/internal/testwasm"
)

// natsOut is an embedded NATS server of the test process, with a store
// directory (so it can be restarted on the same port and keep its streams),
// the stream OUT on out.> (atomic publish allowed; it captures the nats
// sink's data subject out.kill and its commit subjects
// out.kill.streamd-commit.>), and a core subscription to out.> that sees
// every message the sink sends, stored or not: the data messages of an
// atomic batch, then its commit marker.
type natsOut struct {
	t        *testing.T
	port     int
	storeDir string
	srv      *natsutil.Server
	nc       *nats.Conn
	js       jetstream.JetStream

	mu      sync.Mutex
	open    map[string]int                   // Nats-Batch-Id -> data messages seen; its commit not seen yet
	landed  map[string]bool                  // batch ids whose commit was seen
	markers int                              // commit markers seen
	onMsg   func(batchMsgs int, marker bool) // called under mu for every message
}

func startNATSOut(t *testing.T) *natsOut {
	t.Helper()
	o := &natsOut{t: t, storeDir: t.TempDir(), open: map[string]int{}}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	o.port = l.Addr().(*net.TCPAddr).Port
	l.Close()
	o.startServer()
	t.Cleanup(func() {
		if o.srv != nil {
			o.srv.Shutdown()
		}
	})
	o.nc, err = nats.Connect(o.srv.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	must(t, err)
	t.Cleanup(o.nc.Close)
	o.js, err = jetstream.New(o.nc)
	must(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = o.js.CreateStream(ctx, jetstream.StreamConfig{Name: "OUT", Subjects: []string{"out.>"}, AllowAtomicPublish: true})
	must(t, err)
	sub, err := o.nc.Subscribe("out.>", o.watch)
	must(t, err)
	must(t, sub.SetPendingLimits(-1, -1))
	must(t, o.nc.Flush())
	t.Setenv("STREAMD_NATS_URL", o.srv.URL())
	return o
}

func (o *natsOut) startServer() {
	o.t.Helper()
	srv, err := natsutil.StartEmbedded(natsutil.EmbeddedOptions{Port: o.port, NoLog: true, StoreDir: o.storeDir})
	if err != nil {
		o.t.Fatal(err)
	}
	o.srv = srv
}

// restart shuts the server down, waits down (the sink's connection breaks,
// its commits in flight fail) and starts it again on the same port and
// store directory.
func (o *natsOut) restart(down time.Duration) {
	o.t.Helper()
	o.srv.Shutdown()
	o.srv = nil
	time.Sleep(down)
	o.startServer()
}

func (o *natsOut) watch(m *nats.Msg) {
	id := m.Header.Get("Nats-Batch-Id")
	marker := m.Header.Get("Streamd-Commit") != ""
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	switch {
	case id == "":
	case marker:
		o.markers++
		delete(o.open, id)
	default:
		o.open[id]++
		n = o.open[id]
	}
	if o.onMsg != nil {
		o.onMsg(n, marker)
	}
}

// openBatches are the batches whose data the subscription saw and whose
// commit it did not, after a round trip to the server.
func (o *natsOut) openBatches() map[string]int {
	o.nc.FlushTimeout(5 * time.Second)
	o.mu.Lock()
	defer o.mu.Unlock()
	c := make(map[string]int, len(o.open))
	for id, n := range o.open {
		c[id] = n
	}
	clear(o.open)
	return c
}

// outMsg is a stored message of OUT.
type outMsg struct {
	batch  string // Nats-Batch-Id
	marker bool
	line   string // data: key=value
}

// stored reads every message of OUT.
func (o *natsOut) stored() []outMsg {
	o.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	st, err := o.js.Stream(ctx, "OUT")
	must(o.t, err)
	info, err := st.Info(ctx)
	must(o.t, err)
	var out []outMsg
	if info.State.Msgs == 0 {
		return nil
	}
	c, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	must(o.t, err)
	for uint64(len(out)) < info.State.Msgs {
		b, err := c.FetchNoWait(1000)
		if err == nil {
			for m := range b.Messages() {
				h := m.Headers()
				out = append(out, outMsg{batch: h.Get("Nats-Batch-Id"), marker: h.Get("Streamd-Commit") != "", line: h.Get("Streamd-Key") + "=" + string(m.Data())})
			}
			err = b.Error()
		}
		if err != nil && !errors.Is(err, nats.ErrTimeout) {
			o.t.Fatalf("read OUT after %d of %d messages: %v", len(out), info.State.Msgs, err)
		}
		if ctx.Err() != nil {
			o.t.Fatalf("read OUT: %d of %d messages in 60s", len(out), info.State.Msgs)
		}
	}
	return out
}

// checkExactlyOnce checks that OUT's data messages are the job's n records,
// each once, and returns how many of the batches open when a process was
// killed never reached the stream (so the kill interrupted their commit).
func (o *natsOut) checkExactlyOnce(n int, openAtKill map[string]int) (abandoned int) {
	o.t.Helper()
	msgs := o.stored()
	var got []string
	inStream := map[string]bool{}
	for _, m := range msgs {
		if m.batch == "" {
			o.t.Fatalf("a stored message without its Nats-Batch-Id header: %+v", m)
		}
		inStream[m.batch] = true
		if !m.marker {
			got = append(got, m.line)
		}
	}
	want := make([]string, n)
	for i := range want {
		want[i] = fmt.Sprintf("key-%d=V-%d", i%100, i)
	}
	exactlyOnce(o.t, got, want)
	for id := range openAtKill {
		if !inStream[id] {
			abandoned++
		}
	}
	return abandoned
}

// natsKillJob is generator (parallelism 2, n records "v-<i>" with keys
// key-<i mod 100>, rate records/s) -edge-> uppercase -> nats sink on
// out.kill, parallelism 2, a checkpoint every interval into chk/.
func natsKillJob(t *testing.T, dir, edge string, n, rate int, interval time.Duration) {
	t.Helper()
	upper := testwasm.Path(t, "examples/wasm/uppercase/uppercase.wasm")
	job := fmt.Sprintf(`name: natskill
parallelism: 2
checkpoint: {interval: %s, dir: chk}
operators:
  - uid: gen
    parallelism: 2
    source: {type: generator, count: %d, rate: %d, value: "v-{n}"}
  - uid: upper
    wasm: %s
    inputs: [{from: gen, partition: %s}]
  - uid: out
    sink: {type: nats, subject: out.kill}
    inputs: [upper]
`, interval, n, rate, upper, edge)
	must(t, os.WriteFile(filepath.Join(dir, "job.yaml"), []byte(job), 0o644))
}

// killAt is when a round kills streamd run (SIGKILL); the zero value lets
// the run end.
type killAt struct {
	checkpoints int           // once this many checkpoints completed in the round
	batchMsg    int           // at the batchMsg-th data message of a batch whose commit is not seen (a kill during a commit)
	markers     int           // right after the markers-th commit marker of the round (between commits)
	after       time.Duration // this long after the start
	natsDown    time.Duration // with checkpoints: stop NATS, kill while it is down this long, start it again
}

func (k killAt) String() string {
	switch {
	case k.natsDown > 0:
		return fmt.Sprintf("after %d checkpoints, NATS down %s, kill while down", k.checkpoints, k.natsDown)
	case k.checkpoints > 0:
		return fmt.Sprintf("after %d checkpoints", k.checkpoints)
	case k.batchMsg > 0:
		return fmt.Sprintf("at data message %d of an uncommitted batch", k.batchMsg)
	case k.markers > 0:
		return fmt.Sprintf("after commit marker %d", k.markers)
	case k.after > 0:
		return fmt.Sprintf("%s after the start", k.after.Round(time.Millisecond))
	}
	return "no kill"
}

// randomKills is a plan of rounds: kills of each kind at random points.
func randomKills(rng *rand.Rand, rounds int) []killAt {
	plan := make([]killAt, rounds)
	for i := range plan {
		switch i % 4 {
		case 0:
			plan[i] = killAt{checkpoints: 1 + rng.Intn(6)}
		case 1:
			plan[i] = killAt{batchMsg: 1 + rng.Intn(40)}
		case 2:
			plan[i] = killAt{markers: 1 + rng.Intn(8)}
		case 3:
			plan[i] = killAt{after: time.Duration(300+rng.Intn(1200)) * time.Millisecond}
		}
	}
	return plan
}

// newRNG is seeded from STREAMD_TEST_SEED, else the clock; the seed is logged.
func newRNG(t *testing.T) *rand.Rand {
	seed := time.Now().UnixNano()
	if s := os.Getenv("STREAMD_TEST_SEED"); s != "" {
		var err error
		seed, err = strconv.ParseInt(s, 10, 64)
		must(t, err)
	}
	t.Logf("seed %d (STREAMD_TEST_SEED=%d repeats this plan)", seed, seed)
	return rand.New(rand.NewSource(seed))
}

// killRounds runs `streamd run job.yaml` in dir (resume: with `--from chk`),
// then with `--from chk` after every kill, round i killed as plan[i] says and at parallelism
// ps[i%len(ps)] (none: the job's), until a run ends with exit 0. It returns
// the batches open at the kills. Every planned kill must land: the job may
// not finish before the plan is through.
func killRounds(t *testing.T, o *natsOut, dir string, resume bool, plan []killAt, ps []int) map[string]int {
	t.Helper()
	openAtKill := map[string]int{}
	chk := filepath.Join(dir, "chk")
	for round := 0; ; round++ {
		args := []string{"run", "--progress", "off", "job.yaml"}
		if round > 0 || resume {
			args = append(args, "--from", "chk")
		}
		if len(ps) > 0 {
			args = append(args, "-p", strconv.Itoa(ps[round%len(ps)]))
		}
		var k killAt
		if round < len(plan) {
			k = plan[round]
		}
		base := newestCheckpointID(chk)
		o.mu.Lock()
		markers0 := o.markers
		o.mu.Unlock()
		began := time.Now()
		cmd, errb := start(t, dir, args...)
		var once sync.Once
		var killedAt string
		kill := func(why string) {
			once.Do(func() {
				killedAt = why
				cmd.Process.Signal(syscall.SIGKILL)
			})
		}
		o.mu.Lock()
		o.onMsg = func(batchMsgs int, marker bool) {
			switch {
			case k.batchMsg > 0 && batchMsgs == k.batchMsg:
				kill(fmt.Sprintf("data message %d of a batch", batchMsgs))
			case k.markers > 0 && marker && o.markers-markers0 == k.markers:
				kill(fmt.Sprintf("marker %d", k.markers))
			}
		}
		o.mu.Unlock()
		stop := make(chan struct{})
		exited := make(chan struct{})
		go func() { cmd.Wait(); close(exited) }()
		var downMu sync.Mutex // held while NATS is being restarted
		go func() {
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				switch {
				case k.checkpoints > 0 && newestCheckpointID(chk) >= base+int64(k.checkpoints):
					if k.natsDown > 0 {
						downMu.Lock()
						o.srv.Shutdown()
						time.Sleep(k.natsDown / 2)
						kill("NATS down")
						time.Sleep(k.natsDown / 2)
						o.startServer()
						downMu.Unlock()
					} else {
						kill(fmt.Sprintf("checkpoint %d", newestCheckpointID(chk)))
					}
					return
				case k.after > 0 && time.Since(began) >= k.after:
					kill("timer")
					return
				}
			}
		}()
		select {
		case <-exited:
		case <-time.After(120 * time.Second):
			cmd.Process.Kill()
			<-exited
			t.Fatalf("round %d (%s): streamd %s still running after 120s\nstderr:\n%s", round, k, strings.Join(args, " "), errb.String())
		}
		close(stop)
		downMu.Lock()
		downMu.Unlock()
		o.mu.Lock()
		o.onMsg = nil
		markers := o.markers - markers0
		o.mu.Unlock()
		open := o.openBatches()
		ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
		line := fmt.Sprintf("round %d: streamd %s [%s]: ", round, strings.Join(args, " "), k)
		took := time.Since(began).Round(time.Millisecond)
		switch {
		case ws.Signaled() && ws.Signal() == syscall.SIGKILL && killedAt != "":
			recs := 0
			for id, n := range open {
				openAtKill[id] = n
				recs += n
			}
			t.Logf("%skilled at %s after %s; checkpoints %d..%d, %d markers; %d batches open (%d records sent)", line, killedAt, took, base, newestCheckpointID(chk), markers, len(open), recs)
		case ws.Exited() && ws.ExitStatus() == 0:
			t.Logf("%scompleted in %s; checkpoints %d..%d, %d markers", line, took, base, newestCheckpointID(chk), markers)
			if round < len(plan) {
				t.Fatalf("the job finished in round %d, before the %d planned kills: make it longer", round, len(plan))
			}
			return openAtKill
		default:
			t.Fatalf("%s%v after %s\nstderr:\n%s", line, cmd.ProcessState, took, errb.String())
		}
	}
}

// TestNATSSinkKilled is the short form of the long kill tests
// (natskill_long_test.go): generator -hash-> uppercase -> nats sink, p=2,
// streamd run killed with SIGKILL after two checkpoints, the resumed run
// killed during a commit, and a third run to the end: OUT holds every
// record exactly once.
func TestNATSSinkKilled(t *testing.T) {
	o := startNATSOut(t)
	dir := t.TempDir()
	const n = 8000
	natsKillJob(t, dir, "hash", n, 4000, 50*time.Millisecond)
	open := killRounds(t, o, dir, false, []killAt{{checkpoints: 2}, {batchMsg: 3}}, nil)
	checkNATSKill(t, o, n, open)
}

// checkNATSKill checks OUT and logs how many batches the kills cut off
// mid-commit.
func checkNATSKill(t *testing.T, o *natsOut, n int, open map[string]int) {
	t.Helper()
	abandoned := o.checkExactlyOnce(n, open)
	if len(open) == 0 {
		t.Logf("OUT holds each of the %d records once", n)
		return
	}
	t.Logf("OUT holds each of the %d records once; %d of the %d batches open at a kill never reached the stream (their commit was cut off, and done again later)", n, abandoned, len(open))
}
