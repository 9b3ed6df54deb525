package host_test

import (
	"context"
	"errors"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/streamd/streamd/host"
	"github.com/streamd/streamd/internal/testwasm"
)

// module returns a wasm module of the given sections (id, content).
func module(sections ...[]byte) []byte {
	b := []byte{0, 'a', 's', 'm', 1, 0, 0, 0}
	for _, s := range sections {
		b = append(b, s[0])
		b = appendLEB(b, uint32(len(s)-1))
		b = append(b, s[1:]...)
	}
	return b
}

func appendLEB(b []byte, v uint32) []byte {
	for {
		c := byte(v & 0x7f)
		v >>= 7
		if v != 0 {
			b = append(b, c|0x80)
			continue
		}
		return append(b, c)
	}
}

// TestLoadRefusesHugeCounts: counts that do not fit the module's size are
// refused before wazero decodes them (a type section claiming 0xFFFFFFFF
// types made wazero allocate 32 GiB and the process die), with little
// memory allocated.
func TestLoadRefusesHugeCounts(t *testing.T) {
	e := newEngine(t)
	huge := appendLEB(nil, 0xFFFFFFFF)
	cases := map[string][]byte{
		"types":   module(append([]byte{1}, append(huge, 0x60, 0, 0)...)),
		"params":  module(append([]byte{1, 1, 0x60}, append(huge, 0)...)),
		"imports": module(append([]byte{2}, huge...)),
		"locals":  module([]byte{1, 1, 0x60, 0, 0}, []byte{3, 1, 0}, append([]byte{10, 1, 8, 1}, append(huge, 0x7f, 0x0b)...)),
		"memory":  module(append([]byte{5, 1, 0}, appendLEB(nil, 65536)...)),
		"table":   module(append([]byte{4, 1, 0x70, 0}, huge...)),
	}
	for name, wasm := range cases {
		t.Run(name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err := e.Load(context.Background(), name+".wasm", wasm)
			runtime.ReadMemStats(&after)
			if !errors.Is(err, host.ErrBadModule) || !strings.Contains(err.Error(), name+".wasm") {
				t.Fatalf("err = %v, want a bad-module error naming the module", err)
			}
			if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<20 {
				t.Fatalf("loading allocated %d MiB", grew>>20)
			}
			t.Log(err)
		})
	}
}

// FuzzLoad: no input takes the process down; loading either works or is
// refused with ErrBadModule, and the guard (guard.go, which rewrites every
// module that passes precheck) changes neither: an engine without it loads
// exactly the same inputs. The seeds are real modules; `make test-long`
// fuzzes for minutes.
func FuzzLoad(f *testing.F) {
	for _, p := range []string{watConformance, goConformance, "examples/wasm/uppercase-rust/uppercase_rust.wasm", "examples/wasm/wordcount/count.wasm", "host/testdata/guard_features.wasm"} {
		b, err := os.ReadFile(testwasm.Path(f, p))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	ctx := context.Background()
	engine := func(opts ...host.Option) *host.Engine {
		// A short deadline: a mutant may loop forever in _initialize.
		e, err := host.NewEngine(ctx, append([]host.Option{host.WithCacheDir(""), host.WithMemoryLimitMiB(64), host.WithCallDeadline(time.Second)}, opts...)...)
		if err != nil {
			f.Fatal(err)
		}
		f.Cleanup(func() { e.Close(ctx) })
		return e
	}
	guarded, unguarded := engine(), engine(host.WithGuard(false))
	f.Fuzz(func(t *testing.T, wasm []byte) {
		load := func(e *host.Engine) error {
			m, err := e.Load(ctx, "fuzz.wasm", wasm)
			if err != nil {
				if !errors.Is(err, host.ErrBadModule) {
					t.Fatalf("load: %v, want ErrBadModule", err)
				}
				return err
			}
			m.Close(ctx)
			return nil
		}
		errOn, errOff := load(guarded), load(unguarded)
		if (errOn == nil) != (errOff == nil) {
			t.Fatalf("with the guard: %v; without: %v", errOn, errOff)
		}
	})
}
