package upper

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

func TestAppend(t *testing.T) {
	for _, s := range []string{"", "a", "hello world", "MiXeD CaSe 123 with `{|}~ and @[\\]^_", "Grüße aus Köln", "abcdefgh", "abcdefghé", "zzzzzzzzzzzzzzzzz"} {
		if got, want := Append([]byte("pre:"), []byte(s)), "pre:"+string(bytes.ToUpper([]byte(s))); string(got) != want {
			t.Errorf("Append(%q) = %q, want %q", s, got, want)
		}
	}
	if got := Append(nil, []byte("abcdefgh\xff\xfeabc")); string(got) != "ABCDEFGH\xff\xfeABC" {
		t.Errorf("invalid UTF-8: got %q", got)
	}
	// Every ASCII byte in every position of a word agrees with bytes.ToUpper.
	rng := rand.New(rand.NewPCG(1, 1))
	for i := 0; i < 10000; i++ {
		b := make([]byte, rng.IntN(30))
		for j := range b {
			b[j] = byte(rng.IntN(128))
		}
		if got, want := Append(nil, b), bytes.ToUpper(b); !bytes.Equal(got, want) {
			t.Fatalf("Append(%q) = %q, want %q", b, got, want)
		}
	}
}
