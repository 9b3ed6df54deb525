package streamd

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestBatchDecodeMatchesABI(t *testing.T) {
	g := loadGolden(t)
	accepted, rejected := 0, 0
	for i, c := range g.Batches {
		got, err := decodeFrame(c.Frame)
		if (err == nil) != c.Valid {
			t.Fatalf("batch %d (%x): sdk error %v, abi accepts it: %v", i, c.Frame, err, c.Valid)
		}
		if err != nil {
			if !errors.Is(err, errFrame) {
				t.Fatalf("error %q does not say the frame is malformed", err)
			}
			rejected++
			continue
		}
		accepted++
		if !sameRecords(got, c.Records) {
			t.Fatalf("batch %d (%x): decoded %v, want %v", i, c.Frame, got, c.Records)
		}
	}
	if accepted < 200 || rejected < 200 {
		t.Fatalf("weak golden file: %d frames accepted, %d rejected", accepted, rejected)
	}
}

func TestOutFrame(t *testing.T) {
	var o outFrame
	if o.frame() != nil {
		t.Fatal("empty outFrame has a frame")
	}
	g := loadGolden(t)
	frames := 0
	for i, c := range g.Batches {
		if !c.Valid || len(c.Records) == 0 {
			continue
		}
		frames++
		for _, r := range c.Records {
			if len(r.Headers) > 0 {
				o.addWithHeaders(r.Key, r.Value, r.Timestamp, r.Headers)
			} else {
				o.add(r.Key, r.Value, r.Timestamp)
			}
		}
		if !bytes.Equal(o.frame(), c.Frame) {
			t.Fatalf("batch %d: the SDK encodes %x, the host %x", i, o.frame(), c.Frame)
		}
		if o.size() != len(c.Frame) {
			t.Fatalf("batch %d: size %d, want %d", i, o.size(), len(c.Frame))
		}
		o.reset()
		if o.frame() != nil {
			t.Fatalf("batch %d: frame after reset", i)
		}
	}
	if frames < 100 {
		t.Fatalf("weak golden file: %d frames with records", frames)
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
	g := loadGolden(t)
	valid, invalid, versionErrs := 0, 0, 0
	for i, gc := range g.Contexts {
		c, err := decodeContext(gc.Frame)
		if !gc.Valid {
			invalid++
			if err == nil {
				t.Errorf("context %d: decodeContext accepted a malformed frame of %d bytes", i, len(gc.Frame))
			} else if !errors.Is(err, errFrame) {
				t.Errorf("context %d: error %q does not say the frame is malformed", i, err)
			} else if len(gc.Frame) > 0 && gc.Frame[0] == 2 {
				versionErrs++
				if !strings.Contains(err.Error(), "ABI version 2") {
					t.Errorf("version 2 context: error %v", err)
				}
			}
			continue
		}
		valid++
		if err != nil {
			t.Fatalf("context %d: %v", i, err)
		}
		w := gc.Context
		want := Context{Job: w.Job, Operator: w.Operator, Subtask: w.Subtask, Parallelism: w.Parallelism,
			MaxParallelism: w.MaxParallelism, Attempt: w.Attempt, NumInputs: w.NumInputs, Restored: w.Restored,
			Config: Config(w.Config)}
		if !reflect.DeepEqual(*c, want) {
			t.Fatalf("context %d: decoded %+v, want %+v", i, *c, want)
		}
	}
	if valid < 2 || invalid < 4 || versionErrs != 1 {
		t.Fatalf("weak golden file: %d valid contexts, %d malformed, %d of another version", valid, invalid, versionErrs)
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
