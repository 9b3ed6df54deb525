package gotest

import (
	"math/rand/v2"
	"testing"

	"github.com/streamd/streamd/abi"
	"github.com/streamd/streamd/sdk/go/streamdtest"
)

// TestKeyGroupsMatchHost checks the harness's copy of the key-group hash
// (sdk/go/streamdtest/keygroup.go) against the host's (abi/keygroup.go) on
// random keys: a harness snapshot restored at another parallelism must
// split keys as the host does.
func TestKeyGroupsMatchHost(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for i := 0; i < 20000; i++ {
		key := make([]byte, rng.IntN(20))
		for j := range key {
			key[j] = byte(rng.Uint32())
		}
		maxP := 1 + rng.IntN(4096)
		p := 1 + rng.IntN(maxP)
		kg := abi.KeyGroup(key, maxP)
		if got := streamdtest.KeyGroup(key, maxP); got != kg {
			t.Fatalf("key %x, max parallelism %d: harness key group %d, host %d", key, maxP, got, kg)
		}
		if got, want := streamdtest.SubtaskOf(key, maxP, p), abi.SubtaskForKeyGroup(kg, maxP, p); got != want {
			t.Fatalf("key %x, %d/%d: harness subtask %d, host %d", key, maxP, p, got, want)
		}
	}
}
