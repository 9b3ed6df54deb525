package nexmark

import (
	"encoding/binary"
	"testing"
)

// person builds an encoded person by hand, as docs/nexmark.md lays it out.
func person() []byte {
	b := []byte{KindPerson}
	b = binary.LittleEndian.AppendUint64(b, 1007)
	b = binary.LittleEndian.AppendUint64(b, 1436918400123)
	strs := []string{"Kate Smith", "abc@def.com", "1234 5678 9012 3456", "Bend", "OR", "xyz"}
	end := 0
	for _, s := range strs {
		end += len(s)
		b = binary.LittleEndian.AppendUint16(b, uint16(end))
	}
	for _, s := range strs {
		b = append(b, s...)
	}
	return b
}

func TestReadPerson(t *testing.T) {
	e, err := Parse(person())
	if err != nil {
		t.Fatal(err)
	}
	p, ok := e.Person()
	if !ok {
		t.Fatalf("kind %d, want a person", e.Kind())
	}
	if _, ok := e.Bid(); ok {
		t.Fatal("a person is also a bid")
	}
	got := []string{string(p.Name()), string(p.Email()), string(p.CreditCard()), string(p.City()), string(p.State()), string(p.Extra())}
	want := []string{"Kate Smith", "abc@def.com", "1234 5678 9012 3456", "Bend", "OR", "xyz"}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("string %d = %q, want %q", i, got[i], want[i])
		}
	}
	if p.ID() != 1007 || p.DateTime() != 1436918400123 {
		t.Errorf("id %d, date_time %d", p.ID(), p.DateTime())
	}
}

func TestReadWithoutAllocating(t *testing.T) {
	b := person()
	var n int
	if a := testing.AllocsPerRun(100, func() {
		e, _ := Parse(b)
		p, _ := e.Person()
		n += len(p.Name()) + len(p.State()) + int(p.ID()&1)
	}); a != 0 {
		t.Errorf("%v allocations per read, want 0", a)
	}
}

func TestParseRejects(t *testing.T) {
	b := person()
	bad := [][]byte{nil, {3}, b[:5], b[:len(b)-1], append(append([]byte{}, b...), 0)}
	swapped := append([]byte{}, b...)
	binary.LittleEndian.PutUint16(swapped[17:], 500) // name ends after email
	bad = append(bad, swapped)
	for _, x := range bad {
		if _, err := Parse(x); err == nil {
			t.Errorf("Parse(%x) accepted", x)
		}
	}
}
