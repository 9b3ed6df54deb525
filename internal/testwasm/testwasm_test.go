package testwasm

import (
	"os"
	"sync"
	"testing"
)

func TestPathBuildsOnceAndConcurrently(t *testing.T) {
	const target = "internal/conformance/guests/wat/conformance.wasm"
	var wg sync.WaitGroup
	paths := make([]string, 4)
	for i := range paths {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := Build(target)
			if err != nil {
				t.Error(err)
			}
			paths[i] = p
		}()
	}
	wg.Wait()
	b, err := os.ReadFile(paths[0])
	if err != nil {
		t.Fatal(err)
	}
	if string(b[:4]) != "\x00asm" {
		t.Errorf("%s is not a wasm module", paths[0])
	}
	for _, p := range paths[1:] {
		if p != paths[0] {
			t.Errorf("paths differ: %s vs %s", p, paths[0])
		}
	}
}

func TestHasTarget(t *testing.T) {
	if ok, err := HasTarget("internal/conformance/guests/wat/conformance.wasm"); !ok || err != nil {
		t.Errorf("HasTarget(wat conformance) = %v, %v", ok, err)
	}
	if ok, err := HasTarget("no/such/guest.wasm"); ok || err != nil {
		t.Errorf("HasTarget(no such guest) = %v, %v", ok, err)
	}
}
