package connector

import (
	"context"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/streamd/streamd/abi"
)

// Record headers go through a nats sink, staged or direct, as NATS headers
// and come back out of a nats source; the source leaves out streamd's and
// NATS' own headers and orders the others by name.
func TestNATSHeadersRoundTrip(t *testing.T) {
	co, _, js := jsServer(t)
	ctx := context.Background()
	// Names in order, so the source's order (by name) is the record's.
	h := abi.AppendHeader(abi.AppendHeader(abi.AppendHeader(nil, "a-first", []byte("1")), "trace", []byte("t-1")), "trace", []byte("t-2"))
	for _, direct := range []bool{false, true} {
		subj := "orders.h" + map[bool]string{false: "staged", true: "direct"}[direct]
		s, err := NewNATSSink(ctx, NATSSinkOptions{Conn: co, Subject: subj, Job: "j", Operator: "o", Direct: direct}, 0, 1)
		if err != nil {
			t.Fatal(err)
		}
		recs := []abi.Record{{Key: []byte("k"), Value: []byte("with"), Timestamp: 5, Headers: h}, {Value: []byte("without"), Timestamp: abi.NoTimestamp}}
		if err := s.Write(recs); err != nil {
			t.Fatal(err)
		}
		if !direct {
			// Through a checkpoint's state: sealed, encoded, decoded.
			st, err := s.PreCommit(1)
			if err != nil {
				t.Fatal(err)
			}
			es, err := decodeNATSState(st)
			if err != nil || len(es) != 1 {
				t.Fatalf("state: %v, %d entries", err, len(es))
			}
			var hs []string
			if err := EachStaged(es[0].data, func(r abi.Record) error { hs = append(hs, string(r.Headers)); return nil }); err != nil {
				t.Fatal(err)
			}
			if len(hs) != 2 || hs[0] != string(h) || hs[1] != "" {
				t.Fatalf("staged headers %q", hs)
			}
		}
		if err := s.CommitFinal(); err != nil {
			t.Fatal(err)
		}
		s.Close()
	}
	// A message from elsewhere, with headers of its own.
	m := nats.NewMsg("orders.hplain")
	m.Data = []byte("plain")
	m.Header.Add("Zeta", "z")
	m.Header.Add("a-first", "1")
	m.Header.Add("Nats-Msg-Id", "id-1")
	m.Header.Set(HeaderKey, "pk")
	if _, err := js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	src, err := NewNATSSource(ctx, NATSSourceOptions{Conn: co, Stream: "ORDERS", Subject: "orders.>", Bounded: true}, 0, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, eof := readSome(t, src, 8, 100)
	src.Close()
	if !eof || len(got) != 5 {
		t.Fatalf("read %d records (eof %v), want 5", len(got), eof)
	}
	want := map[string]string{"with": string(h), "without": "",
		"plain": string(abi.AppendHeader(abi.AppendHeader(nil, "Zeta", []byte("z")), "a-first", []byte("1")))}
	for _, r := range got {
		if r.headers != want[r.value] {
			t.Errorf("record %q read with headers %q, want %q", r.value, r.headers, want[r.value])
		}
	}
}

// A record header NATS cannot carry, or named like streamd's or NATS' own
// headers, fails the write with what is wrong, before anything is staged.
func TestNATSSinkRefusesBadHeaders(t *testing.T) {
	co, _, _ := jsServer(t)
	s, err := NewNATSSink(context.Background(), NATSSinkOptions{Conn: co, Subject: "orders.bad", Job: "j", Operator: "o"}, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, c := range []struct{ name, value, want string }{
		{"", "v", "without a name"},
		{"a:b", "v", `header name "a:b" cannot be a NATS header name`},
		{"a b", "v", "cannot be a NATS header name"},
		{"streamd-key", "v", "names starting with Streamd- or Nats-"},
		{"Nats-Msg-Id", "v", "names starting with Streamd- or Nats-"},
		{"ok", "line\nbreak", "cannot hold a line break"},
	} {
		rec := abi.Record{Value: []byte("x"), Headers: abi.AppendHeader(nil, c.name, []byte(c.value))}
		err := s.Write([]abi.Record{{Value: []byte("fine")}, rec})
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "record 1 of the batch") {
			t.Errorf("header %q: %q: error %v, want it to say %q", c.name, c.value, err, c.want)
		}
	}
	if s.cur.n != 0 {
		t.Errorf("%d records staged by refused writes", s.cur.n)
	}
}
