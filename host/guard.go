package host

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/tetratelabs/wazero/api"
)

// The guard: compiled wasm cannot be preempted, so a guest loop that never
// ends would hold its thread forever and the Go runtime's stop-the-world
// (every GC) would wait for it, freezing the whole process. guard rewrites a
// module before it is compiled so that every loop counts its iterations in a
// local and calls the host import streamd_guard.yield every guardInterval of
// them; yield returns to Go (a preemption point) and fails the call when its
// context is done or it ran past the call deadline (Instance.yield).
//
// The rewrite adds the import after the module's own function imports, which
// shifts every defined function's index by one: calls, ref.func, exports,
// the start function, element segments and the name section are renumbered.
// In each function that has a loop it appends an i32 local c, sets it to
// guardInterval on entry, and right after every `loop` inserts
//
//	local.get c; i32.const 1; i32.sub; local.tee c; i32.eqz
//	if; call $yield; i32.const guardInterval; local.set c; end
//
// which leaves the operand stack and the label depths of the loop body as
// they were. The decoder covers everything wazero accepts with its default
// features (Wasm 2.0: MVP, sign extension, multi-value, non-trapping
// float-to-int, bulk memory, reference types, SIMD); anything else is
// refused with the function and byte offset. A module without loops is
// returned unchanged. The output is a function of the input bytes only, so
// wazero's compilation cache (keyed by module bytes) keeps working.
const (
	guardModule = "streamd_guard"
	guardYield  = "yield"
	// guardInterval is how many loop iterations run between two yields.
	// A yield costs ~0.1 µs and an iteration at least ~0.3 ns, so 1<<14
	// makes yields at most ~2% of a tight loop's time (well under that for
	// real loops, see host/RATIONALE.md) while a spinning guest comes back
	// to Go every ~5-50 µs, which bounds how long a GC waits for it.
	guardInterval = 1 << 14
)

// errGuard marks a module the guard cannot rewrite.
var errGuard = errors.New("cannot instrument")

// guard returns wasm with its loops instrumented (see above). wasm has
// passed precheck, so every section and vector fits the module's size.
func guard(wasm []byte) ([]byte, error) {
	g := &guardRewriter{in: wasm, yieldType: -1}
	if err := g.scan(); err != nil {
		return nil, err
	}
	out, err := g.emit()
	switch {
	case err != nil:
		return nil, err
	case g.loops == 0:
		return wasm, nil
	}
	return out, nil
}

type section struct {
	id         byte
	start, end int // content, after the id and size
}

type guardRewriter struct {
	in        []byte
	sections  []section
	params    []uint32 // parameter count of each type
	funcTypes []uint32 // type index of each defined function
	imported  uint32   // function imports
	yieldType int64    // index of a () -> () type, -1: none yet
	loops     int
}

// fidx renumbers a function index of the original module.
func (g *guardRewriter) fidx(i uint32) uint32 {
	if i >= g.imported {
		return i + 1
	}
	return i
}

func (g *guardRewriter) yieldIndex() uint32 { return g.imported }

// scan splits the module into sections and reads the types, imports and
// function types the rewrite needs.
func (g *guardRewriter) scan() error {
	r := &wreader{b: g.in, off: 8}
	for r.off < len(r.b) {
		id, _ := r.byte()
		size, err := r.u32()
		if err != nil || int64(size) > int64(r.remaining()) {
			return fmt.Errorf("%w: section at byte %d", errTruncated, r.off)
		}
		s := section{id: id, start: r.off, end: r.off + int(size)}
		r.off = s.end
		g.sections = append(g.sections, s)
		sr := &wreader{b: g.in[:s.end], off: s.start}
		switch id {
		case 1:
			err = g.scanTypes(sr)
		case 2:
			err = g.scanImports(sr)
		case 3:
			err = g.scanFunctions(sr)
		}
		if err != nil {
			return fmt.Errorf("section %s at byte %d: %w", sectionName(id), s.start, err)
		}
	}
	return nil
}

func (g *guardRewriter) scanTypes(r *wreader) error {
	n, err := r.count()
	if err != nil {
		return err
	}
	for i := uint32(0); i < n; i++ {
		if c, err := r.byte(); err != nil || c != 0x60 {
			return fmt.Errorf("type %d is not a function type", i)
		}
		np, err := r.name() // a vector of one-byte value types
		if err != nil {
			return err
		}
		nr, err := r.name()
		if err != nil {
			return err
		}
		if np == 0 && nr == 0 && g.yieldType < 0 {
			g.yieldType = int64(i)
		}
		g.params = append(g.params, np)
	}
	return nil
}

func (g *guardRewriter) scanImports(r *wreader) error {
	n, err := r.count()
	if err != nil {
		return err
	}
	for i := uint32(0); i < n; i++ {
		at := r.off
		mod, kind, err := r.importEntry(0)
		if err != nil {
			return err
		}
		if string(mod) == guardModule {
			return fmt.Errorf("import %d at byte %d is from %s, a module reserved for the host", i, at, guardModule)
		}
		if kind == 0 {
			g.imported++
		}
	}
	return nil
}

func (g *guardRewriter) scanFunctions(r *wreader) error {
	n, err := r.count()
	if err != nil {
		return err
	}
	for i := uint32(0); i < n; i++ {
		t, err := r.u32()
		if err != nil {
			return err
		}
		if int(t) >= len(g.params) {
			return fmt.Errorf("function %d has type %d, but there are %d types", g.imported+i, t, len(g.params))
		}
		g.funcTypes = append(g.funcTypes, t)
	}
	return nil
}

// emit writes the rewritten module.
func (g *guardRewriter) emit() ([]byte, error) {
	out := make([]byte, 0, len(g.in)+len(g.in)/8+64)
	out = append(out, g.in[:8]...)
	typesDone, importsDone := false, false
	for _, s := range g.sections {
		if s.id != 0 && s.id > 1 && !typesDone { // no type section: add one for yield
			out = appendSection(out, 1, g.typeSection(nil))
			typesDone = true
		}
		if s.id != 0 && s.id > 2 && !importsDone {
			out = appendSection(out, 2, g.importSection(nil))
			importsDone = true
		}
		content := g.in[s.start:s.end]
		var err error
		switch s.id {
		case 0:
			content, err = g.customSection(s)
		case 1:
			content, typesDone = g.typeSection(content), true
		case 2:
			content, importsDone = g.importSection(content), true
		case 6:
			content, err = g.rewrite(s.start, s.end, (*patcher).globals)
		case 7:
			content, err = g.rewrite(s.start, s.end, (*patcher).exports)
		case 8:
			content, err = g.rewrite(s.start, s.end, (*patcher).funcIdx)
		case 9:
			content, err = g.rewrite(s.start, s.end, (*patcher).elements)
		case 10:
			content, err = g.codeSection(s)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: section %s at byte %d: %w", errGuard, sectionName(s.id), s.start, err)
		}
		if content != nil {
			out = appendSection(out, s.id, content)
		}
	}
	if !typesDone {
		out = appendSection(out, 1, g.typeSection(nil))
	}
	if !importsDone {
		out = appendSection(out, 2, g.importSection(nil))
	}
	return out, nil
}

func appendSection(out []byte, id byte, content []byte) []byte {
	out = append(out, id)
	out = appendU32(out, uint32(len(content)))
	return append(out, content...)
}

func appendU32(b []byte, v uint32) []byte {
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

func appendName(b []byte, s string) []byte {
	return append(appendU32(b, uint32(len(s))), s...)
}

// typeSection returns the type section with a () -> () type appended if it
// has none (content nil: there was no type section).
func (g *guardRewriter) typeSection(content []byte) []byte {
	if g.yieldType >= 0 {
		return content
	}
	g.yieldType = int64(len(g.params))
	r := &wreader{b: content}
	n, _ := r.u32() // read by scan
	out := appendU32(nil, n+1)
	out = append(out, content[r.off:]...)
	return append(out, 0x60, 0, 0)
}

// importSection returns the import section with streamd_guard.yield
// appended after the module's imports.
func (g *guardRewriter) importSection(content []byte) []byte {
	r := &wreader{b: content}
	n, _ := r.u32()
	out := appendU32(nil, n+1)
	out = append(out, content[r.off:]...)
	out = appendName(out, guardModule)
	out = appendName(out, guardYield)
	out = append(out, 0)
	return appendU32(out, uint32(g.yieldType))
}

// patcher copies a section's bytes, replacing what it rewrites: bytes
// between last and off are copied by flush.
type patcher struct {
	wreader
	g    *guardRewriter
	out  []byte
	last int
}

func (p *patcher) flush() {
	p.out = append(p.out, p.b[p.last:p.off]...)
	p.last = p.off
}

// rewrite runs f over the module's bytes [start, end) and returns the
// patched copy.
func (g *guardRewriter) rewrite(start, end int, f func(*patcher) error) ([]byte, error) {
	n := end - start
	p := &patcher{wreader: wreader{b: g.in[:end], off: start}, g: g, out: make([]byte, 0, n+n/16+8), last: start}
	if err := f(p); err != nil {
		return nil, err
	}
	if p.off != len(p.b) {
		return nil, fmt.Errorf("%d bytes left over at byte %d", len(p.b)-p.off, p.off)
	}
	p.flush()
	return p.out, nil
}

// funcIdx rewrites one function index.
func (p *patcher) funcIdx() error {
	p.flush()
	v, err := p.u32()
	if err != nil {
		return err
	}
	p.out = appendU32(p.out, p.g.fidx(v))
	p.last = p.off
	return nil
}

// vec calls f count times.
func (p *patcher) vec(f func(*patcher) error) error {
	n, err := p.count()
	if err != nil {
		return err
	}
	for i := uint32(0); i < n; i++ {
		if err := f(p); err != nil {
			return fmt.Errorf("entry %d: %w", i, err)
		}
	}
	return nil
}

func (p *patcher) globals() error {
	return p.vec(func(p *patcher) error {
		if err := p.skip(2); err != nil { // value type, mutability
			return err
		}
		return p.expr(-1)
	})
}

func (p *patcher) exports() error {
	return p.vec(func(p *patcher) error {
		if _, err := p.name(); err != nil {
			return err
		}
		kind, err := p.byte()
		if err != nil {
			return err
		}
		if kind == 0 {
			return p.funcIdx()
		}
		_, err = p.u32()
		return err
	})
}

// elements rewrites the element section, in all eight encodings.
func (p *patcher) elements() error {
	return p.vec(func(p *patcher) error {
		flags, err := p.u32()
		if err != nil {
			return err
		}
		if flags > 7 {
			return fmt.Errorf("element segment flags %d", flags)
		}
		if flags&2 != 0 && flags&1 == 0 { // active with a table index
			if _, err := p.u32(); err != nil {
				return err
			}
		}
		if flags&1 == 0 { // active: an offset expression
			if err := p.expr(-1); err != nil {
				return err
			}
		}
		if flags&3 != 0 { // element kind or reference type
			if _, err := p.byte(); err != nil {
				return err
			}
		}
		if flags&4 == 0 {
			return p.vec((*patcher).funcIdx)
		}
		return p.vec(func(p *patcher) error { return p.expr(-1) })
	})
}

// codeSection rewrites every function body.
func (g *guardRewriter) codeSection(s section) ([]byte, error) {
	r := &wreader{b: g.in[:s.end], off: s.start}
	n, err := r.count()
	if err != nil {
		return nil, err
	}
	if int(n) != len(g.funcTypes) {
		return nil, fmt.Errorf("%d function bodies for %d functions", n, len(g.funcTypes))
	}
	size := s.end - s.start
	out := make([]byte, 0, size+size/8+16)
	out = append(out, g.in[s.start:r.off]...)
	var code []byte
	for i := uint32(0); i < n; i++ {
		fn := g.imported + i
		at := r.off
		size, err := r.u32()
		if err != nil {
			return nil, fmt.Errorf("function %d at byte %d: %w", fn, at, err)
		}
		if int64(size) > int64(r.remaining()) {
			return nil, fmt.Errorf("function %d at byte %d: body of %d bytes, but only %d remain", fn, at, size, r.remaining())
		}
		end := r.off + int(size)
		var head []byte
		head, code, err = g.body(code[:0], g.in[:end], r.off, g.params[g.funcTypes[i]])
		if err != nil {
			return nil, fmt.Errorf("function %d (body at byte %d): %w", fn, at, err)
		}
		out = appendU32(out, uint32(len(head)+len(code)))
		out = append(append(out, head...), code...)
		r.off = end
	}
	if r.off != s.end {
		return nil, fmt.Errorf("%d bytes after the last function body", s.end-r.off)
	}
	return out, nil
}

// body rewrites the function body b[off:]: it returns the locals
// declaration (with the counter local and its initialization when the body
// has a loop) and the rewritten instructions, written into code.
func (g *guardRewriter) body(code, b []byte, off int, params uint32) (head, _ []byte, err error) {
	r := &wreader{b: b, off: off}
	n, err := r.count()
	if err != nil {
		return nil, nil, fmt.Errorf("locals: %w", err)
	}
	afterCount := r.off
	locals := uint64(params)
	for i := uint32(0); i < n; i++ {
		k, err := r.u32()
		if err == nil {
			_, err = r.byte()
		}
		if err != nil {
			return nil, nil, fmt.Errorf("locals: %w", err)
		}
		locals += uint64(k)
	}
	if locals >= 1<<32-1 {
		return nil, nil, fmt.Errorf("%d locals", locals)
	}
	codeStart := r.off
	p := &patcher{wreader: *r, g: g, out: code, last: codeStart}
	loops := g.loops
	if err := p.expr(int64(locals)); err != nil {
		return nil, nil, err
	}
	if p.off != len(b) {
		return nil, nil, fmt.Errorf("%d bytes after the end of the body at byte %d", len(b)-p.off, p.off)
	}
	p.flush()
	if g.loops == loops {
		return b[off:codeStart], p.out, nil // no loop: only calls renumbered
	}
	// Append the counter local c, and set c = guardInterval on entry.
	head = appendU32(make([]byte, 0, codeStart-off+16), n+1)
	head = append(head, b[afterCount:codeStart]...)
	head = append(head, 1, 0x7f, 0x41)    // one i32; i32.const
	head = appendU32(head, guardInterval) // positive and < 1<<20: the same bytes as s32
	head = append(head, 0x21)             // local.set c
	head = appendU32(head, uint32(locals))
	return head, p.out, nil
}

// appendCheck appends the countdown that follows every loop (see the top of
// the file); c is the counter local.
func (g *guardRewriter) appendCheck(out []byte, c uint32) []byte {
	out = append(out, 0x20) // local.get c
	out = appendU32(out, c)
	out = append(out, 0x41, 1, 0x6b, 0x22) // i32.const 1; i32.sub; local.tee c
	out = appendU32(out, c)
	out = append(out, 0x45, 0x04, 0x40, 0x10) // i32.eqz; if; call
	out = appendU32(out, g.yieldIndex())
	out = append(out, 0x41) // i32.const N
	out = appendU32(out, guardInterval)
	out = append(out, 0x21) // local.set c
	out = appendU32(out, c)
	return append(out, 0x0b) // end
}

// expr copies an expression up to and including its final end, renumbering
// function indices; counter >= 0 (a function body, the counter local)
// instruments loops, counter < 0 is a constant expression.
func (p *patcher) expr(counter int64) error {
	depth := 0
	for {
		at := p.off
		op, err := p.byte()
		if err != nil {
			return fmt.Errorf("expression ends without end at byte %d", at)
		}
		switch {
		case op == 0x02 || op == 0x04: // block, if
			err = p.leb(5)
			depth++
		case op == 0x03: // loop
			if err = p.leb(5); err == nil && counter >= 0 {
				p.flush()
				p.out = p.g.appendCheck(p.out, uint32(counter))
				p.g.loops++
			}
			depth++
		case op == 0x0b: // end
			if depth == 0 {
				return nil
			}
			depth--
		case op == 0x10 || op == 0x12 || op == 0xd2: // call, return_call, ref.func
			err = p.funcIdx()
		default:
			err = p.skipInstr(op)
		}
		if err != nil {
			return fmt.Errorf("instruction 0x%02x at byte %d: %w", op, at, err)
		}
	}
}

// leb skips a LEB128 of at most max bytes (signed or not).
func (r *wreader) leb(max int) error {
	for i := 0; i < max; i++ {
		c, err := r.byte()
		if err != nil {
			return err
		}
		if c&0x80 == 0 {
			return nil
		}
	}
	return fmt.Errorf("LEB128 longer than %d bytes", max)
}

func (r *wreader) u32s(n int) error {
	for range n {
		if _, err := r.u32(); err != nil {
			return err
		}
	}
	return nil
}

func (r *wreader) memarg() error {
	align, err := r.u32()
	if err != nil {
		return err
	}
	if align&0x40 != 0 { // a memory index follows (multi-memory)
		if _, err := r.u32(); err != nil {
			return err
		}
	}
	return r.leb(10)
}

// skipInstr skips the immediates of op (other than those expr handles).
func (r *wreader) skipInstr(op byte) error {
	switch {
	case op <= 0x01, op == 0x05, op == 0x0f, op == 0x1a, op == 0x1b, op == 0xd1, op >= 0x45 && op <= 0xc4:
		return nil // unreachable, nop, else, return, drop, select, ref.is_null, numeric
	case op == 0x0c || op == 0x0d: // br, br_if
		return r.u32s(1)
	case op == 0x0e: // br_table
		n, err := r.count()
		if err != nil {
			return err
		}
		return r.u32s(int(n) + 1)
	case op == 0x11 || op == 0x13: // call_indirect, return_call_indirect
		return r.u32s(2)
	case op == 0x1c: // select t*
		n, err := r.count()
		if err != nil {
			return err
		}
		return r.skip(n)
	case op >= 0x20 && op <= 0x26: // local.*, global.*, table.get/set
		return r.u32s(1)
	case op >= 0x28 && op <= 0x3e: // loads, stores
		return r.memarg()
	case op == 0x3f || op == 0x40: // memory.size, memory.grow
		return r.u32s(1)
	case op == 0x41:
		return r.leb(5)
	case op == 0x42:
		return r.leb(10)
	case op == 0x43:
		return r.skip(4)
	case op == 0x44:
		return r.skip(8)
	case op == 0xd0: // ref.null t
		_, err := r.byte()
		return err
	case op == 0xfc:
		return r.skipFC()
	case op == 0xfd:
		return r.skipSIMD()
	}
	return fmt.Errorf("unknown or unsupported opcode 0x%02x", op)
}

func (r *wreader) skipFC() error {
	sub, err := r.u32()
	if err != nil {
		return err
	}
	switch {
	case sub <= 7: // trunc_sat
		return nil
	case sub == 8 || sub == 10 || sub == 12 || sub == 14: // memory.init, memory.copy, table.init, table.copy
		return r.u32s(2)
	case sub <= 17: // data.drop, memory.fill, elem.drop, table.grow/size/fill
		return r.u32s(1)
	}
	return fmt.Errorf("unknown opcode 0xfc %d", sub)
}

func (r *wreader) skipSIMD() error {
	sub, err := r.u32()
	if err != nil {
		return err
	}
	switch {
	case sub <= 0x0b || sub == 0x5c || sub == 0x5d: // loads, store, load_zero
		return r.memarg()
	case sub == 0x0c || sub == 0x0d: // v128.const, i8x16.shuffle
		return r.skip(16)
	case sub >= 0x15 && sub <= 0x22: // extract/replace lane
		return r.skip(1)
	case sub >= 0x54 && sub <= 0x5b: // load/store lane
		if err := r.memarg(); err != nil {
			return err
		}
		return r.skip(1)
	case sub <= 0xff:
		return nil
	}
	return fmt.Errorf("unknown or unsupported opcode 0xfd %d", sub)
}

// customSection renumbers the function indices of the name section and
// drops DWARF sections, whose code offsets the rewrite invalidates; other
// custom sections stay as they are.
func (g *guardRewriter) customSection(s section) ([]byte, error) {
	content := g.in[s.start:s.end]
	r := &wreader{b: g.in[:s.end], off: s.start}
	n, err := r.name()
	if err != nil {
		return nil, err
	}
	name := string(g.in[r.off-int(n) : r.off])
	switch {
	case strings.HasPrefix(name, ".debug_"):
		return nil, nil
	case name != "name":
		return content, nil
	}
	out := append([]byte(nil), g.in[s.start:r.off]...)
	for r.off < len(r.b) {
		id, _ := r.byte()
		size, err := r.u32()
		if err != nil || int64(size) > int64(r.remaining()) {
			return nil, fmt.Errorf("name section: subsection %d at byte %d does not fit", id, r.off)
		}
		subStart := r.off
		r.off += int(size)
		sub := g.in[subStart:r.off]
		var f func(*patcher) error
		switch id {
		case 1: // function names
			f = (*patcher).nameMap
		case 2, 3: // local names, label names: by function
			f = func(p *patcher) error {
				return p.vec(func(p *patcher) error {
					if err := p.funcIdx(); err != nil {
						return err
					}
					return p.vec(func(p *patcher) error { return p.skipNamed() })
				})
			}
		}
		if f != nil {
			rw, err := g.rewrite(subStart, r.off, f)
			switch {
			case err != nil && id == 3:
				continue // label names are not used by wazero: drop them
			case err != nil:
				return nil, fmt.Errorf("name section: subsection %d: %w", id, err)
			}
			sub = rw
		}
		out = append(out, id)
		out = appendU32(out, uint32(len(sub)))
		out = append(out, sub...)
	}
	return out, nil
}

func (p *patcher) nameMap() error {
	return p.vec(func(p *patcher) error {
		if err := p.funcIdx(); err != nil {
			return err
		}
		_, err := p.name()
		return err
	})
}

func (p *patcher) skipNamed() error {
	if _, err := p.u32(); err != nil {
		return err
	}
	_, err := p.name()
	return err
}

// instantiateGuardModule registers streamd_guard.yield, which instrumented
// loops call every guardInterval iterations.
func (e *Engine) instantiateGuardModule(ctx context.Context) error {
	_, err := e.runtime.NewHostModuleBuilder(guardModule).
		NewFunctionBuilder().
		WithGoModuleFunction(api.GoModuleFunc(func(ctx context.Context, mod api.Module, _ []uint64) {
			if v, ok := e.instances.Load(mod); ok {
				v.(*Instance).yield(ctx)
				return
			}
			// The load-time instance (checkVersion): its context carries the bound.
			if err := ctx.Err(); err != nil {
				panic(&hostCallPanic{ErrCanceled, fmt.Sprintf("guest call stopped: %v", context.Cause(ctx))})
			}
		}), nil, nil).
		Export(guardYield).
		Instantiate(ctx)
	return err
}

// yield runs in Go every guardInterval loop iterations of the guest: the
// goroutine can be preempted here (so a GC never waits long for a guest),
// and a call whose context is done or that has run past the deadline is
// failed. The deadline clock starts at the call's first yield (a call that
// never yields is short) and stops while the guest is in emit. It does not
// allocate.
func (i *Instance) yield(ctx context.Context) {
	if ctx.Err() != nil {
		i.failure = &hostCallPanic{ErrCanceled, fmt.Sprintf("the call's context ended during the guest call (%v)", context.Cause(ctx))}
		panic(i.failure)
	}
	d := i.eng.cfg.callDeadline
	if d == 0 {
		return
	}
	now := time.Now()
	if i.callStart.IsZero() {
		i.callStart = now
		return
	}
	if now.Sub(i.callStart) > d {
		i.failure = &hostCallPanic{ErrDeadline, fmt.Sprintf("guest call exceeded the %v deadline", d)}
		panic(i.failure)
	}
}
