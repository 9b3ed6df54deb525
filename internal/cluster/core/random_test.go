package core

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// TestRandomRuns drives two controllers, three hosts and the store with
// random events (ticks, deliveries in any order, pauses, cut-off
// controllers and hosts, lost hosts, failures, deploys, cancels, an
// unreachable store) and checks on every step what must always hold: only
// a leader writes, assigns or cancels, in its own term; no record is
// overwritten by an older term; no attempt number is assigned twice. Then
// everything heals and the cluster must settle: one leader, and every job
// that runs is run by exactly the hosts of its record, nothing else.
var traceRandom = flag.Bool("trace-random", false, "log every step of TestRandomRuns")

func TestRandomRuns(t *testing.T) {
	seeds := 300
	if testing.Short() {
		seeds = 50
	}
	for seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { randomRun(t, uint64(seed)) })
		if t.Failed() {
			return
		}
	}
}

func randomRun(t *testing.T, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 26))
	s := newSim(t)
	var log []string
	do := func(cmd string) {
		log = append(log, cmd)
		out := s.run(strings.Fields(cmd))
		if *traceRandom {
			t.Logf("%s -> %v", cmd, out)
		}
		if t.Failed() {
			t.Fatalf("seed %d, after:\n%s", seed, strings.Join(log, "\n"))
		}
	}
	lease := "renew=1 self=4 ttl=6" // leaders last through some missed deliveries
	if seed%2 == 1 {
		lease = "renew=1 self=2 ttl=3" // they change often
	}
	do("controllers c1 c2 slot-wait=1 adopt-wait=2 " + lease)
	for i, n := range []int{2, 1, 3} {
		do(fmt.Sprintf("host h%d slots=%d", i+1, n))
	}
	pick := func(xs []string) string { return xs[rng.IntN(len(xs))] }
	cores, hosts := []string{"c1", "c2"}, []string{"h1", "h2", "h3"}
	jobs := 0
	for range 400 {
		switch r := rng.IntN(100); {
		case r < 30:
			do("tick only")
		case r < 60:
			do("deliver " + pick(cores))
		case r < 66:
			if jobs < 5 {
				jobs++
				p := 1 + rng.IntN(4)
				do(fmt.Sprintf("deploy j%d p=%d min=%d cp=%d", jobs, p, rng.IntN(p+1), 3*rng.IntN(2)))
			}
		case r < 68:
			if jobs > 0 {
				do(fmt.Sprintf("cancel j%d", 1+rng.IntN(jobs)))
			}
		case r < 74:
			if refs := s.runningRefs(); len(refs) > 0 {
				x := refs[rng.IntN(len(refs))]
				do(fmt.Sprintf("fail %s %s", x[0], x[1]))
			}
		case r < 78:
			do(pick([]string{"pause ", "resume "}) + pick(cores))
		case r < 82:
			do(pick([]string{"cut ", "heal "}) + pick(cores))
		case r < 88:
			h := pick(hosts)
			do(pick([]string{"lose-host ", "silence ", "silence "}) + h)
		case r < 94:
			h := pick(hosts)
			do(fmt.Sprintf("host %s slots=%d", h, 1+rng.IntN(3)))
		default:
			do(pick([]string{"store-down", "store-up", "store-up"}))
		}
		s.standBy() // a deposed controller's process stands a new one by
	}
	// Everything heals: the cluster settles.
	for _, c := range cores {
		do("resume " + c)
		do("heal " + c)
	}
	do("store-up")
	for _, h := range hosts {
		if !s.hosts[h].up() {
			do("host " + h + " slots=2")
		}
	}
	for range 30 {
		do("tick")
		s.standBy()
	}
	var leaders []string
	for _, c := range s.cores {
		if c.c.Term() != 0 {
			leaders = append(leaders, c.name)
		}
	}
	if len(leaders) != 1 {
		t.Fatalf("seed %d: leaders %v after healing; after:\n%s", seed, leaders, strings.Join(log, "\n"))
	}
	if testing.Verbose() {
		t.Logf("seed %d: leader %s, store: %s", seed, leaders[0], strings.Join(s.run([]string{"store"}), "; "))
	}
	want := map[string][]string{} // host -> the attempts it should run
	for _, st := range s.store.recs {
		r := st.Record
		if r.Placement == nil || Terminal(r.State) {
			continue
		}
		for _, h := range hostsOf(r.Placement) {
			want[h] = append(want[h], AttemptRef{Job: r.Job, Attempt: r.Attempt}.String())
		}
	}
	for _, h := range hosts {
		var got []string
		for _, ref := range sortedRefs(s.hosts[h].running) {
			got = append(got, ref.String())
		}
		slices.Sort(want[h])
		if !slices.Equal(got, want[h]) {
			t.Fatalf("seed %d: host %s runs %v, the records say %v\n%s\nafter:\n%s", seed, h, got, want[h],
				strings.Join(s.run([]string{"store"}), "\n"), strings.Join(log, "\n"))
		}
	}
}

// runningRefs is each (host, attempt) that runs.
func (s *sim) runningRefs() [][2]string {
	var out [][2]string
	for _, h := range sortedKeys(s.hosts) {
		for _, ref := range sortedRefs(s.hosts[h].running) {
			out = append(out, [2]string{h, ref.String()})
		}
	}
	return out
}

// standBy replaces each deposed controller with a new standby of the same
// name, as the process running it does.
func (s *sim) standBy() {
	for _, c := range s.cores {
		if c.c.Deposed() {
			nc, err := New(c.c.cfg)
			if err != nil {
				s.t.Fatal(err)
			}
			c.c = nc // what the old one had queued may still land (late)
			s.step(c, s.leaseSeen())
		}
	}
}
