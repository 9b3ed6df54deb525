// Package host runs streamd guest operators (ABI v1, see abi/ABI.md) on wazero:
// one compiled module per operator, one instance per subtask, host-held keyed
// state and timers, traps turned into *Error values that name the subtask.
package host

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"

	"github.com/streamd/streamd/abi"
)

const wasiModule = wasi_snapshot_preview1.ModuleName

type config struct {
	cacheDir       string
	cacheDirSet    bool
	memoryLimitMiB int
	callDeadline   time.Duration
	logger         *slog.Logger
	allowClock     bool
	guard          bool
	clock          func() time.Time
}

// DefaultCallDeadline bounds a guest call unless WithCallDeadline says otherwise.
const DefaultCallDeadline = time.Minute

// MinCallDeadline is the least positive call deadline WithCallDeadline
// takes: the guard (guard.go) looks at the clock only every guardInterval
// loop iterations (~5-50 µs apart), and the deadline counts from a call's
// first look, so a shorter bound could not be kept to within its size.
const MinCallDeadline = time.Millisecond

// Option configures an Engine. Options validate their argument.
type Option func(*config) error

// WithCacheDir sets the directory of the compiled-module cache, shared by every
// process that uses it. The default is os.UserCacheDir()/streamd/wazero; ""
// disables the on-disk cache (modules are then compiled once per Engine).
func WithCacheDir(dir string) Option {
	return func(c *config) error {
		c.cacheDir, c.cacheDirSet = dir, true
		return nil
	}
}

// WithMemoryLimitMiB sets each instance's linear-memory limit (default 256).
func WithMemoryLimitMiB(n int) Option {
	return func(c *config) error {
		if n < 1 || n > 4096 {
			return fmt.Errorf("host: memory limit %d MiB out of range [1, 4096]", n)
		}
		c.memoryLimitMiB = n
		return nil
	}
}

// WithCallDeadline bounds every guest call (default DefaultCallDeadline): a
// call whose guest code runs longer fails with ErrDeadline. Time the guest
// spends in emit (waiting for downstream) does not count. 0 means no
// deadline; the call still ends with ErrCanceled when its context is done.
func WithCallDeadline(d time.Duration) Option {
	return func(c *config) error {
		if d < 0 {
			return fmt.Errorf("host: negative call deadline %v", d)
		}
		if d > 0 && d < MinCallDeadline {
			return fmt.Errorf("host: call deadline %v is below %v, the least the guard can enforce (it checks the clock every %d loop iterations, every ~5-50 µs, from a call's first check on); use 0 for no deadline", d, MinCallDeadline, guardInterval)
		}
		c.callDeadline = d
		return nil
	}
}

// WithGuard(false) turns off the loop instrumentation that keeps a guest
// from freezing the process (guard.go) and brings back wazero's
// WithCloseOnContextDone for a positive deadline. It exists to measure what
// the guard costs (benchmarks); without it a guest that never returns
// blocks every garbage collection, and so the whole process, forever.
func WithGuard(on bool) Option {
	return func(c *config) error {
		c.guard = on
		return nil
	}
}

// WithLogger sets where guest log lines and stdout/stderr go (default slog.Default()).
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error {
		if l == nil {
			return errors.New("host: nil logger")
		}
		c.logger = l
		return nil
	}
}

// WithAllowClock gives guests the real wall and monotonic clocks. By default
// WASI clocks are fake and deterministic (they do not leak the host's time).
func WithAllowClock(b bool) Option {
	return func(c *config) error {
		c.allowClock = b
		return nil
	}
}

// WithClock sets the host's processing-time clock (default time.Now): what
// state TTL, processing-time timers and the processing_time import read.
// Tests inject a fake one; InstanceConfig.Clock overrides it per instance.
func WithClock(now func() time.Time) Option {
	return func(c *config) error {
		if now == nil {
			return errors.New("host: nil clock")
		}
		c.clock = now
		return nil
	}
}

// Engine owns a wazero runtime with the host imports, WASI, and the compiled
// module cache. It is safe for concurrent use; instances are not.
type Engine struct {
	cfg       config
	runtime   wazero.Runtime
	cache     wazero.CompilationCache
	memLimit  uint64 // bytes
	hostFuncs map[string]api.FunctionDefinition
	wasiFuncs map[string]api.FunctionDefinition
	instances sync.Map // api.Module -> *Instance
	seq       atomic.Uint64
	closed    atomic.Bool

	// mu guards compiled. Modules with the same bytes share one compiled
	// module, closed when the last Module using it is closed: wazero keys its
	// compiled code by the module's bytes, so closing one of two compiled
	// modules of the same bytes breaks the other (wazero issue #2336), and
	// one host runs several jobs or attempts of the same module at once.
	mu       sync.Mutex
	compiled map[[sha256.Size]byte]*sharedModule
}

// sharedModule is a compiled, validated module and how many Modules use it.
type sharedModule struct {
	cm      wazero.CompiledModule
	hasInit bool
	refs    int
}

// NewEngine creates an engine. Close it to release the runtime and compiled code.
func NewEngine(ctx context.Context, opts ...Option) (*Engine, error) {
	cfg := config{memoryLimitMiB: 256, logger: slog.Default(), callDeadline: DefaultCallDeadline, guard: true, clock: time.Now}
	for _, o := range opts {
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	if !cfg.cacheDirSet {
		if d, err := os.UserCacheDir(); err == nil {
			cfg.cacheDir = filepath.Join(d, "streamd", "wazero")
		}
	}
	e := &Engine{cfg: cfg, memLimit: uint64(cfg.memoryLimitMiB) << 20, compiled: map[[sha256.Size]byte]*sharedModule{}}
	rc := wazero.NewRuntimeConfigCompiler().
		WithMemoryLimitPages(uint32(cfg.memoryLimitMiB) * 16).
		WithCloseOnContextDone(!cfg.guard && cfg.callDeadline > 0)
	if cfg.cacheDir != "" {
		c, err := wazero.NewCompilationCacheWithDir(cfg.cacheDir)
		if err != nil {
			return nil, fmt.Errorf("host: compilation cache in %s: %w", cfg.cacheDir, err)
		}
		e.cache = c
		rc = rc.WithCompilationCache(c)
	}
	e.runtime = wazero.NewRuntimeWithConfig(ctx, rc)
	if _, err := wasi_snapshot_preview1.Instantiate(ctx, e.runtime); err != nil {
		e.Close(ctx)
		return nil, fmt.Errorf("host: instantiate WASI: %w", err)
	}
	if cfg.guard {
		if err := e.instantiateGuardModule(ctx); err != nil {
			e.Close(ctx)
			return nil, fmt.Errorf("host: instantiate %s: %w", guardModule, err)
		}
	}
	hm, err := e.instantiateHostModule(ctx)
	if err != nil {
		e.Close(ctx)
		return nil, fmt.Errorf("host: instantiate %s: %w", abi.ImportModule, err)
	}
	e.hostFuncs = hm.ExportedFunctionDefinitions()
	e.wasiFuncs = e.runtime.Module(wasiModule).ExportedFunctionDefinitions()
	return e, nil
}

// Close releases the runtime, every instance and the in-memory compiled code.
// The on-disk cache stays.
func (e *Engine) Close(ctx context.Context) error {
	if e.closed.Swap(true) {
		return nil
	}
	var err error
	if e.runtime != nil {
		err = e.runtime.Close(ctx)
	}
	if e.cache != nil {
		err = errors.Join(err, e.cache.Close(ctx))
	}
	if err != nil {
		return fmt.Errorf("host: close engine: %w", err)
	}
	return nil
}

// Module is a validated, compiled guest module. Instantiate it once per subtask.
type Module struct {
	eng      *Engine
	name     string
	compiled wazero.CompiledModule
	hasInit  bool
	digest   [sha256.Size]byte
	closed   atomic.Bool
}

// Name is the path or name the module was loaded under.
func (m *Module) Name() string { return m.name }

// Exports are the names of the functions the module exports, sorted.
func (m *Module) Exports() []string {
	var names []string
	for name := range m.compiled.ExportedFunctions() {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// Imports are the functions the module imports, as "module.name", sorted,
// each once (without the yield import the loop guard adds).
func (m *Module) Imports() []string {
	var names []string
	for _, imp := range m.compiled.ImportedFunctions() {
		mod, fn, _ := imp.Import()
		if mod == guardModule && fn == guardYield && m.eng.cfg.guard {
			continue
		}
		names = append(names, mod+"."+fn)
	}
	sort.Strings(names)
	return slices.Compact(names) // a module may import one function twice
}

// Close releases the compiled code once no other Module of the same bytes uses
// it (instances made from it keep working until closed). Closing twice does
// nothing.
func (m *Module) Close(ctx context.Context) error {
	if m.closed.Swap(true) {
		return nil
	}
	e := m.eng
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.compiled[m.digest]
	if s == nil || s.cm != m.compiled {
		return nil // a module that never made it into the table (validation failed)
	}
	if s.refs--; s.refs > 0 {
		return nil
	}
	delete(e.compiled, m.digest)
	return s.cm.Close(ctx)
}

// LoadFile reads, validates and compiles the module at path.
func (e *Engine) LoadFile(ctx context.Context, path string) (*Module, error) {
	wasm, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w %s: %w", ErrBadModule, path, err)
	}
	return e.Load(ctx, path, wasm)
}

var wasmMagic = []byte{0x00, 'a', 's', 'm'}

// Load validates and compiles wasm, named name in errors. It refuses (with an
// error wrapping ErrBadModule) bytes that are not a Wasm module, a module
// whose structure does not fit its size (checked in bounded memory before
// wazero decodes it: precheck), a missing or
// mistyped export, an import outside streamd_v1 and WASI, and an ABI version
// other than abi.Version.
func (e *Engine) Load(ctx context.Context, name string, wasm []byte) (*Module, error) {
	if e.closed.Load() {
		return nil, fmt.Errorf("host: load %s: engine closed", name)
	}
	switch {
	case len(wasm) >= 4 && !bytes.Equal(wasm[:4], wasmMagic):
		return nil, badModule(name, "not a wasm module (no \\0asm magic)")
	case len(wasm) < 8:
		if len(wasm) == 0 || !bytes.HasPrefix(wasmMagic, wasm[:min(len(wasm), 4)]) {
			return nil, badModule(name, "not a wasm module (%d bytes)", len(wasm))
		}
		return nil, badModule(name, "truncated: %d bytes, shorter than the wasm header", len(wasm))
	case wasm[4] != 1 || wasm[5] != 0 || wasm[6] != 0 || wasm[7] != 0:
		return nil, badModule(name, "not a wasm module: binary version %x, want 1", wasm[4:8])
	}
	if err := precheck(wasm, uint32(e.cfg.memoryLimitMiB)*16); err != nil {
		if errors.Is(err, errTruncated) {
			return nil, badModule(name, "truncated: %v", err)
		}
		return nil, badModule(name, "malformed: %v", err)
	}
	digest := sha256.Sum256(wasm)
	// Compiling under the lock keeps two loads of the same bytes from
	// compiling (and later closing) two compiled modules of them.
	e.mu.Lock()
	defer e.mu.Unlock()
	if s := e.compiled[digest]; s != nil {
		s.refs++
		return &Module{eng: e, name: name, compiled: s.cm, hasInit: s.hasInit, digest: digest}, nil
	}
	code := wasm
	if e.cfg.guard {
		var err error
		if code, err = guard(wasm); err != nil {
			return nil, badModule(name, "%v", err)
		}
	}
	cm, err := e.runtime.CompileModule(ctx, code)
	if err != nil {
		if isTruncation(err) {
			return nil, badModule(name, "truncated: %v", err)
		}
		return nil, badModule(name, "invalid wasm: %v", err)
	}
	m := &Module{eng: e, name: name, compiled: cm, digest: digest}
	if err := e.validate(ctx, m); err != nil {
		cm.Close(ctx)
		return nil, err
	}
	e.compiled[digest] = &sharedModule{cm: cm, hasInit: m.hasInit, refs: 1}
	return m, nil
}

func isTruncation(err error) bool {
	s := err.Error()
	for _, p := range []string{"EOF", "unexpected end", "truncated", "section size mismatch", "invalid section length"} {
		if bytes.Contains([]byte(s), []byte(p)) {
			return true
		}
	}
	return false
}

func (e *Engine) validate(ctx context.Context, m *Module) error {
	cm := m.compiled
	if _, ok := cm.ExportedMemories()["memory"]; !ok {
		return badModule(m.name, "missing export memory (the guest must export its linear memory as \"memory\")")
	}
	if len(cm.ImportedMemories()) > 0 {
		return badModule(m.name, "imports a memory; a guest must define and export its own")
	}
	exports := cm.ExportedFunctions()
	for _, name := range abi.RequiredExports {
		if _, ok := exports[name]; !ok {
			return badModule(m.name, "missing export %s", name)
		}
	}
	for name, want := range abi.ExportSignatures {
		def, ok := exports[name]
		if !ok {
			continue
		}
		if !sameSig(def, want) {
			return badModule(m.name, "export %s has signature %s, want %s", name, sigString(def.ParamTypes(), def.ResultTypes()), abiSigString(want))
		}
	}
	if def, ok := exports["_initialize"]; ok {
		if len(def.ParamTypes()) != 0 || len(def.ResultTypes()) != 0 {
			return badModule(m.name, "export _initialize has signature %s, want () -> ()", sigString(def.ParamTypes(), def.ResultTypes()))
		}
		m.hasInit = true
	}
	for _, imp := range cm.ImportedFunctions() {
		mod, fn, _ := imp.Import()
		var known map[string]api.FunctionDefinition
		switch mod {
		case abi.ImportModule:
			known = e.hostFuncs
		case wasiModule:
			known = e.wasiFuncs
		case guardModule:
			if e.cfg.guard && fn == guardYield {
				continue // added by guard, which refuses modules importing it themselves
			}
			fallthrough
		default:
			return badModule(m.name, "imports %s.%s: only %s and %s imports are allowed", mod, fn, abi.ImportModule, wasiModule)
		}
		want, ok := known[fn]
		if !ok {
			return badModule(m.name, "imports unknown function %s.%s", mod, fn)
		}
		if !equalTypes(imp.ParamTypes(), want.ParamTypes()) || !equalTypes(imp.ResultTypes(), want.ResultTypes()) {
			return badModule(m.name, "import %s.%s has signature %s, want %s", mod, fn,
				sigString(imp.ParamTypes(), imp.ResultTypes()), sigString(want.ParamTypes(), want.ResultTypes()))
		}
	}
	return e.checkVersion(ctx, m)
}

// checkVersion instantiates a throwaway instance and asks streamd_abi_version.
func (e *Engine) checkVersion(ctx context.Context, m *Module) error {
	var stderr tailBuffer
	mc := wazero.NewModuleConfig().
		WithName(fmt.Sprintf("streamd-load-%d", e.seq.Add(1))).
		WithStartFunctions().
		WithArgs(filepath.Base(m.name)).
		WithStderr(&stderr)
	if e.cfg.callDeadline > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, max(e.cfg.callDeadline, 10*time.Second))
		defer cancel()
	}
	mod, err := e.runtime.InstantiateModule(ctx, m.compiled, mc)
	if err != nil {
		return badModule(m.name, "cannot instantiate: %v%s", err, stderr.suffix())
	}
	defer mod.Close(ctx)
	if m.hasInit {
		if _, err := mod.ExportedFunction("_initialize").Call(ctx); err != nil {
			return badModule(m.name, "_initialize failed: %v%s", err, stderr.suffix())
		}
	}
	res, err := mod.ExportedFunction(abi.ExportABIVersion).Call(ctx)
	if err != nil {
		return badModule(m.name, "%s failed: %v%s", abi.ExportABIVersion, err, stderr.suffix())
	}
	if v := int32(res[0]); v != abi.Version {
		return badModule(m.name, "ABI version %d, host supports %d", v, abi.Version)
	}
	return nil
}

func sameSig(def api.FunctionDefinition, want abi.Signature) bool {
	return equalABITypes(def.ParamTypes(), want.Params) && equalABITypes(def.ResultTypes(), want.Results)
}

func equalABITypes(got []api.ValueType, want []abi.ValueType) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if byte(got[i]) != byte(want[i]) {
			return false
		}
	}
	return true
}

func equalTypes(a, b []api.ValueType) bool {
	return bytes.Equal(a, b)
}

func sigString(params, results []api.ValueType) string {
	return typeList(params) + " -> " + typeList(results)
}

func abiSigString(s abi.Signature) string {
	p := make([]api.ValueType, len(s.Params))
	for i, t := range s.Params {
		p[i] = api.ValueType(t)
	}
	r := make([]api.ValueType, len(s.Results))
	for i, t := range s.Results {
		r[i] = api.ValueType(t)
	}
	return sigString(p, r)
}

func typeList(ts []api.ValueType) string {
	var b bytes.Buffer
	b.WriteByte('(')
	for i, t := range ts {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(api.ValueTypeName(t))
	}
	b.WriteByte(')')
	return b.String()
}
