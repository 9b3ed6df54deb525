package streamd

import (
	"bytes"
	"errors"
	"math"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/streamd/streamd/abi"
)

func randomRecords(rng *rand.Rand, n int) []abi.Record {
	recs := make([]abi.Record, n)
	for i := range recs {
		var key []byte
		if rng.IntN(3) > 0 {
			key = make([]byte, rng.IntN(20)+1)
			for j := range key {
				key[j] = byte(rng.Uint32())
			}
		}
		val := make([]byte, rng.IntN(40))
		for j := range val {
			val[j] = byte(rng.Uint32())
		}
		ts := rng.Int64() - math.MaxInt64/2
		if rng.IntN(5) == 0 {
			ts = abi.NoTimestamp
		}
		recs[i] = abi.Record{Key: key, Value: val, Timestamp: ts}
	}
	return recs
}

// decodeAll walks a frame with the SDK's decoder.
func decodeAll(t *testing.T, frame []byte) []abi.Record {
	t.Helper()
	n, err := checkBatch(frame)
	if err != nil {
		t.Fatalf("checkBatch: %v", err)
	}
	var recs []abi.Record
	off := 4
	var r Record
	for i := 0; i < n; i++ {
		r, off = nextRecord(frame, off)
		recs = append(recs, abi.Record{Key: r.Key, Value: r.Value, Timestamp: r.Timestamp})
	}
	return recs
}

func sameRecords(a, b []abi.Record) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !bytes.Equal(a[i].Key, b[i].Key) || !bytes.Equal(a[i].Value, b[i].Value) || a[i].Timestamp != b[i].Timestamp {
			return false
		}
	}
	return true
}

func TestBatchDecodeMatchesABI(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 2, 7, 100} {
		recs := randomRecords(rng, n)
		frame := abi.AppendBatch(nil, recs)
		if got := decodeAll(t, frame); !sameRecords(got, recs) {
			t.Fatalf("%d records: decoded %v, want %v", n, got, recs)
		}
	}
}

// TestBatchValidationMatchesABI mutates valid frames at random and checks
// that the SDK accepts exactly the frames the host's codec accepts.
func TestBatchValidationMatchesABI(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	accepted, rejected := 0, 0
	for i := 0; i < 5000; i++ {
		frame := abi.AppendBatch(nil, randomRecords(rng, rng.IntN(5)))
		switch rng.IntN(4) {
		case 0: // flip a byte, often a length
			if len(frame) > 0 {
				frame[rng.IntN(len(frame))] = byte(rng.Uint32())
			}
		case 1: // truncate
			frame = frame[:rng.IntN(len(frame)+1)]
		case 2: // trailing bytes
			frame = append(frame, make([]byte, rng.IntN(3)+1)...)
		}
		_, sdkErr := checkBatch(frame)
		_, abiErr := abi.DecodeBatch(frame, nil)
		if (sdkErr == nil) != (abiErr == nil) {
			t.Fatalf("frame %x: sdk error %v, abi error %v", frame, sdkErr, abiErr)
		}
		if sdkErr != nil {
			if !errors.Is(sdkErr, errFrame) {
				t.Fatalf("error %q does not say the frame is malformed", sdkErr)
			}
			rejected++
			continue
		}
		accepted++
		want, _ := abi.DecodeBatch(frame, nil)
		if got := decodeAll(t, frame); !sameRecords(got, want) {
			t.Fatalf("frame %x: decoded %v, want %v", frame, got, want)
		}
	}
	if accepted < 500 || rejected < 500 {
		t.Fatalf("weak test: %d accepted, %d rejected", accepted, rejected)
	}
}

func TestOutFrame(t *testing.T) {
	var o outFrame
	if o.frame() != nil {
		t.Fatal("empty outFrame has a frame")
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for round := 0; round < 3; round++ {
		recs := randomRecords(rng, 10)
		for _, r := range recs {
			o.add(r.Key, r.Value, r.Timestamp)
		}
		got, err := abi.DecodeBatch(o.frame(), nil)
		if err != nil {
			t.Fatalf("round %d: host cannot decode the SDK's frame: %v", round, err)
		}
		if !sameRecords(got, recs) {
			t.Fatalf("round %d: frame holds %v, want %v", round, got, recs)
		}
		if want := abi.BatchSize(recs); o.size() != want {
			t.Fatalf("round %d: size %d, want %d", round, o.size(), want)
		}
		o.reset()
		if o.frame() != nil {
			t.Fatalf("round %d: frame after reset", round)
		}
	}
	key, val := []byte("key"), bytes.Repeat([]byte("v"), 100)
	allocs := testing.AllocsPerRun(100, func() {
		for i := 0; i < 50; i++ {
			o.add(key, val, int64(i))
		}
		o.frame()
		o.reset()
	})
	if allocs != 0 {
		t.Fatalf("reusing the output frame allocates %v times per run", allocs)
	}
}

func TestDecodeContext(t *testing.T) {
	want := abi.OpenContext{
		Job: "wc", Operator: "count", Subtask: 2, Parallelism: 4, MaxParallelism: 128,
		Attempt: 3, NumInputs: 2, Restored: true,
		Config: map[string]string{"size_ms": "5000", "name": "x", "empty": ""},
	}
	c, err := decodeContext(abi.AppendOpenContext(nil, want))
	if err != nil {
		t.Fatal(err)
	}
	got := abi.OpenContext{Job: c.Job, Operator: c.Operator, Subtask: c.Subtask, Parallelism: c.Parallelism,
		MaxParallelism: c.MaxParallelism, Attempt: c.Attempt, NumInputs: c.NumInputs, Restored: c.Restored,
		Config: map[string]string(c.Config)}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("decoded %+v, want %+v", got, want)
	}

	c, err = decodeContext(abi.AppendOpenContext(nil, abi.OpenContext{Job: "j", Parallelism: 1}))
	if err != nil || c.Restored || len(c.Config) != 0 || c.Job != "j" {
		t.Fatalf("minimal context: %+v, %v", c, err)
	}

	frame := abi.AppendOpenContext(nil, want)
	for _, bad := range [][]byte{nil, frame[:10], frame[:len(frame)-1], append(frame[:len(frame):len(frame)], 0)} {
		if _, err := decodeContext(bad); err == nil {
			t.Errorf("decodeContext accepted a malformed frame of %d bytes", len(bad))
		}
	}
	wrongVersion := append([]byte(nil), frame...)
	wrongVersion[0] = 2
	if _, err := decodeContext(wrongVersion); err == nil || !bytes.Contains([]byte(err.Error()), []byte("ABI version 2")) {
		t.Errorf("version 2 context: error %v", err)
	}
}

func TestConfig(t *testing.T) {
	c := Config{"n": "42", "neg": "-7", "bad": "4x", "t": "true", "f": "0", "b": "yes", "s": "text"}
	if got := c.String("s", "d"); got != "text" {
		t.Errorf("String(s) = %q", got)
	}
	if got := c.String("missing", "d"); got != "d" {
		t.Errorf("String(missing) = %q", got)
	}
	for key, want := range map[string]int64{"n": 42, "neg": -7, "missing": 9} {
		if got, err := c.Int(key, 9); err != nil || got != want {
			t.Errorf("Int(%s) = %d, %v; want %d", key, got, err, want)
		}
	}
	if _, err := c.Int("bad", 9); err == nil || !bytes.Contains([]byte(err.Error()), []byte(`"bad"`)) {
		t.Errorf("Int(bad): error %v does not name the key", err)
	}
	for key, want := range map[string]bool{"t": true, "f": false, "missing": true} {
		if got, err := c.Bool(key, true); err != nil || got != want {
			t.Errorf("Bool(%s) = %v, %v; want %v", key, got, err, want)
		}
	}
	if _, err := c.Bool("b", false); err == nil {
		t.Error(`Bool("yes") is not an error`)
	}
}
