package line

import "testing"

func TestParse(t *testing.T) {
	for in, want := range map[string]struct {
		key string
		ts  int64
	}{
		"alice,1000":            {"alice", 1000},
		" bob , -5 \r":          {"bob", -5},
		"a,b,42":                {"a,b", 42},
		"k,0":                   {"k", 0},
		"x,9223372036854775807": {"x", 9223372036854775807},
	} {
		key, ts, err := Parse([]byte(in))
		if err != nil || string(key) != want.key || ts != want.ts {
			t.Errorf("Parse(%q) = %q, %d, %v; want %q, %d", in, key, ts, err, want.key, want.ts)
		}
	}
	for _, in := range []string{"", "alice", ",5", "alice,", "alice,12x", "alice,1.5"} {
		if _, _, err := Parse([]byte(in)); err == nil {
			t.Errorf("Parse(%q) accepted a bad line", in)
		}
	}
}
