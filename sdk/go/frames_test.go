package streamd

import (
	"bytes"
	"encoding/json"
	"os"
	"testing"
)

// The SDK does not import the host's abi package (this module depends on the
// standard library only), so its codec tests read frames the abi package
// encoded and decoded: testdata/frames.json, written and kept current by
// sdk/gotest's TestGoldenFrames in the root module.

type goldenFrames struct {
	Batches []struct {
		Frame   []byte   `json:"frame"`
		Valid   bool     `json:"valid"`
		Records []Record `json:"records"`
	} `json:"batches"`
	Contexts []struct {
		Frame   []byte `json:"frame"`
		Valid   bool   `json:"valid"`
		Context *struct {
			Job, Operator                                            string
			Subtask, Parallelism, MaxParallelism, Attempt, NumInputs int
			Restored                                                 bool
			Config                                                   map[string]string
		} `json:"context"`
	} `json:"contexts"`
}

func loadGolden(t testing.TB) *goldenFrames {
	t.Helper()
	b, err := os.ReadFile("testdata/frames.json")
	if err != nil {
		t.Fatal(err)
	}
	var g goldenFrames
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatalf("testdata/frames.json: %v", err)
	}
	return &g
}

// batch encodes records with the SDK's own encoder (checked against the
// golden frames by TestOutFrame).
func batch(recs ...Record) []byte {
	var o outFrame
	for _, r := range recs {
		if len(r.Headers) > 0 {
			o.addWithHeaders(r.Key, r.Value, r.Timestamp, r.Headers)
		} else {
			o.add(r.Key, r.Value, r.Timestamp)
		}
	}
	if f := o.frame(); f != nil {
		return bytes.Clone(f)
	}
	return []byte{0, 0, 0, 0}
}

// decodeFrame decodes a batch with the SDK's decoder, copying the records.
func decodeFrame(frame []byte) ([]Record, error) { return decodeRecords(frame) }

func recordSize(r Record) int {
	n := recordHeader + len(r.Key) + len(r.Value)
	if len(r.Headers) > 0 {
		n += 4 + len(r.Headers)
	}
	return n
}

func frameSize(recs []Record) int {
	n := 4
	for _, r := range recs {
		n += recordSize(r)
	}
	return n
}

func sameRecords(a, b []Record) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !bytes.Equal(a[i].Key, b[i].Key) || !bytes.Equal(a[i].Value, b[i].Value) || a[i].Timestamp != b[i].Timestamp ||
			!bytes.Equal(a[i].Headers, b[i].Headers) {
			return false
		}
	}
	return true
}

// contextFrame returns the golden open-context frame of job and operator
// (the SDK has no encoder of its own for them).
func contextFrame(t testing.TB, job, operator string) []byte {
	t.Helper()
	for _, c := range loadGolden(t).Contexts {
		if c.Valid && c.Context.Job == job && c.Context.Operator == operator {
			return c.Frame
		}
	}
	t.Fatalf("testdata/frames.json has no open context of job %q, operator %q", job, operator)
	return nil
}
