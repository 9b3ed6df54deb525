package host

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tetratelabs/wazero"

	"github.com/streamd/streamd/internal/testwasm"
)

// guardModules are the example and test modules of the repository; the
// round trip also takes every other .wasm it finds under these roots.
var guardModules = []string{
	"examples/wasm/uppercase/uppercase.wasm",
	"examples/wasm/uppercase-rust/uppercase_rust.wasm",
	"examples/wasm/window-count/window-count.wasm",
	"examples/wasm/window-count/keyby.wasm",
	"examples/wasm/wordcount/split.wasm",
	"examples/wasm/wordcount/count.wasm",
	"internal/testguests/failonce/failonce.wasm",
	"internal/conformance/guests/go/conformance.wasm",
	"internal/conformance/guests/rust/conformance.wasm",
	"internal/conformance/guests/wat/conformance.wasm",
	"host/testdata/guard_features.wasm",
	"host/testdata/spin.wasm",
	"host/testdata/noop.wasm",
}

func repoModules(t *testing.T) []string {
	var paths []string
	for _, m := range guardModules {
		paths = append(paths, testwasm.Path(t, m))
	}
	root, err := testwasm.Root()
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{"examples", "internal", "sdk", "host/testdata"} {
		filepath.WalkDir(filepath.Join(root, dir), func(p string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() && strings.HasSuffix(p, ".wasm") && !slices.Contains(paths, p) {
				paths = append(paths, p)
			}
			return nil
		})
	}
	return paths
}

// TestGuardRoundTrip: every module of the repository is instrumented
// deterministically into a module wazero compiles, with the same exports
// (renumbered by the added import, names kept by the name section) and one
// more import when it has loops.
func TestGuardRoundTrip(t *testing.T) {
	ctx := context.Background()
	rt := wazero.NewRuntime(ctx)
	defer rt.Close(ctx)
	for _, p := range repoModules(t) {
		name, _ := filepath.Rel(filepath.Dir(filepath.Dir(p)), p)
		t.Run(name, func(t *testing.T) {
			wasm, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			if err := precheck(wasm, 0); err != nil {
				t.Skipf("not a module the host loads: %v", err)
			}
			start := time.Now()
			out, err := guard(wasm)
			took := time.Since(start)
			if err != nil {
				t.Fatal(err)
			}
			again, err := guard(wasm)
			if err != nil || !bytes.Equal(out, again) {
				t.Fatalf("second instrumentation differs (%v)", err)
			}
			orig, err := rt.CompileModule(ctx, wasm)
			if err != nil {
				t.Skipf("wazero refuses the original: %v", err)
			}
			start = time.Now()
			cm, err := rt.CompileModule(ctx, out)
			compile := time.Since(start)
			if err != nil {
				t.Fatalf("wazero refuses the instrumented module: %v", err)
			}
			t.Logf("%d -> %d bytes; instrumented in %v, compiled in %v", len(wasm), len(out), took, compile)
			shift := uint32(0)
			if !bytes.Equal(out, wasm) {
				shift = 1
				imps := cm.ImportedFunctions()
				if len(imps) != len(orig.ImportedFunctions())+1 {
					t.Fatalf("%d function imports, want %d", len(imps), len(orig.ImportedFunctions())+1)
				}
				if m, n, _ := imps[len(imps)-1].Import(); m != guardModule || n != guardYield {
					t.Fatalf("last import %s.%s, want %s.%s", m, n, guardModule, guardYield)
				}
			}
			got := cm.ExportedFunctions()
			for n, def := range orig.ExportedFunctions() {
				g := got[n]
				if g == nil {
					t.Fatalf("export %s lost", n)
				}
				if g.Index() != def.Index()+shift || g.Name() != def.Name() || !equalTypes(g.ParamTypes(), def.ParamTypes()) {
					t.Fatalf("export %s: function %d %q, want %d %q", n, g.Index(), g.Name(), def.Index()+shift, def.Name())
				}
			}
		})
	}
}

// TestGuardFeatures runs every export of guard_features.wasm with and
// without the guard and compares the results; its "count" loop yields once
// per guardInterval iterations.
func TestGuardFeatures(t *testing.T) {
	ctx := context.Background()
	wasm, err := os.ReadFile(testwasm.Path(t, "host/testdata/guard_features.wasm"))
	if err != nil {
		t.Fatal(err)
	}
	out, err := guard(wasm)
	if err != nil {
		t.Fatal(err)
	}
	rt := wazero.NewRuntime(ctx)
	defer rt.Close(ctx)
	_, err = rt.NewHostModuleBuilder("env").NewFunctionBuilder().
		WithFunc(func(x uint32) uint32 { return x*7 + 1 }).Export("ext").Instantiate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	yields := 0
	_, err = rt.NewHostModuleBuilder(guardModule).NewFunctionBuilder().
		WithFunc(func() { yields++ }).Export(guardYield).Instantiate(ctx)
	if err != nil {
		t.Fatal(err)
	}
	run := func(wasm []byte, name string) map[string]uint64 {
		mod, err := rt.InstantiateWithConfig(ctx, wasm, wazero.NewModuleConfig().WithName(name))
		if err != nil {
			t.Fatal(err)
		}
		defer mod.Close(ctx)
		res := map[string]uint64{}
		for _, c := range []struct {
			fn   string
			args []uint64
		}{
			{"started", nil}, {"loopy", []uint64{100, 0}}, {"loopy", []uint64{50, 1}}, {"loopy", []uint64{9, 2}},
			{"via_global", []uint64{21}}, {"via_t2", []uint64{5, 0}}, {"via_t2", []uint64{5, 1}},
			{"passive", []uint64{4}}, {"ext", []uint64{6}}, {"reffunc", nil}, {"branchy", []uint64{1000}},
			{"mixed", []uint64{10}}, {"count", []uint64{10 * guardInterval}},
		} {
			r, err := mod.ExportedFunction(c.fn).Call(ctx, c.args...)
			if err != nil {
				t.Fatalf("%s%v: %v", c.fn, c.args, err)
			}
			res[fmt.Sprint(c.fn, c.args)] = r[0]
		}
		return res
	}
	want := run(wasm, "plain")
	yields = 0
	got := run(out, "guarded")
	if !equalMaps(got, want) {
		t.Fatalf("guarded results %v, want %v", got, want)
	}
	// count's 10*guardInterval iterations yield 10 times; the other loops
	// are short (they reset their counters on entry).
	if yields != 10 {
		t.Fatalf("%d yields, want 10", yields)
	}
}

func equalMaps(a, b map[string]uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
