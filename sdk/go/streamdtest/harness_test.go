package streamdtest

import (
	"errors"
	"strings"
	"testing"

	streamd "github.com/streamd/streamd/sdk/go"
)

// TestKeyHashGolden pins the copy of the host's key hash (abi/keygroup.go)
// to values the abi package computes; sdk/gotest compares the two on random
// keys.
func TestKeyHashGolden(t *testing.T) {
	for _, c := range []struct {
		key  string
		hash uint32
		kg   int
	}{
		{"", 2872998923, 11},
		{"a", 444641715, 51},
		{"alice", 3927234078, 30},
		{"key-42", 3239141685, 53},
		{"\x00\xff", 1230491568, 48},
	} {
		if h, kg := keyHash([]byte(c.key)), KeyGroup([]byte(c.key), 128); h != c.hash || kg != c.kg {
			t.Errorf("key %q: hash %d group %d, the host's are %d and %d", c.key, h, kg, c.hash, c.kg)
		}
	}
	// Subtask ranges cover every group once, as the host's RangeForSubtask.
	for _, p := range []int{1, 3, 4, 7} {
		next := 0
		for s := 0; s < p; s++ {
			a, b := keyGroupRange(s, 128, p)
			if a != next {
				t.Fatalf("p=%d subtask %d starts at %d, want %d", p, s, a, next)
			}
			for kg := a; kg <= b; kg++ {
				if kg*p/128 != s {
					t.Fatalf("p=%d: group %d in the range of %d but owned by %d", p, kg, s, kg*p/128)
				}
			}
			next = b + 1
		}
		if next != 128 {
			t.Fatalf("p=%d: ranges end at %d", p, next)
		}
	}
}

type failingOp struct {
	streamd.Base
	closed bool
}

func (o *failingOp) ProcessElement(r streamd.Record, _ int) error {
	if string(r.Value) == "bad" {
		return errors.New("bad value")
	}
	streamd.Emit(r.Key, r.Value, r.Timestamp)
	return nil
}

func (o *failingOp) Close() error { o.closed = true; return nil }

func TestFailureEndsTheSubtask(t *testing.T) {
	op := &failingOp{}
	h := New(op, Options{})
	if err := h.Open(); err != nil {
		t.Fatal(err)
	}
	if err := h.ProcessElement(streamd.Record{Value: []byte("ok")}, 0); err != nil {
		t.Fatal(err)
	}
	err := h.ProcessElement(streamd.Record{Value: []byte("bad")}, 0)
	var f *Failure
	if !errors.As(err, &f) || f.Phase != "ProcessElement" || !strings.Contains(f.Msg, "bad value") {
		t.Fatalf("err %v, want a ProcessElement failure with the error", err)
	}
	if err := h.ProcessWatermark(5); !errors.As(err, &f) {
		t.Fatalf("call after the failure: %v", err)
	}
	if err := h.Close(); err != nil || op.closed {
		t.Fatalf("Close after a failure: err %v, Close called %v; the host never calls a failed instance", err, op.closed)
	}
	if got := h.Output(); len(got) != 1 || string(got[0].Value) != "ok" {
		t.Fatalf("output %v", got)
	}
	if err := h.ProcessElement(streamd.Record{}, 1); err == nil || !strings.Contains(err.Error(), "input 1 outside") {
		t.Fatalf("bad input index: %v", err)
	}
}
