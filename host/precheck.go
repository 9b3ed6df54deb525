package host

import (
	"errors"
	"fmt"
)

// precheck walks a module's binary structure before wazero decodes it, in
// memory and time bounded by the module's size: every section fits the
// bytes that remain, every vector count and length fits the bytes that
// remain of its section (each element takes at least one byte), function
// locals stay within maxLocals, and memory and table minimums within the
// limits. wazero allocates by declared counts while it decodes, so one
// count changed to 0xFFFFFFFF in a 63 KB module would otherwise make it
// allocate tens of GiB and take the process down. A module that passes may
// still be invalid; wazero says so then.
func precheck(wasm []byte, maxMemoryPages uint32) error {
	r := &wreader{b: wasm, off: 8} // after magic and version (checked by Load)
	for r.off < len(r.b) {
		start := r.off
		id, err := r.byte()
		if err != nil {
			return err
		}
		size, err := r.u32()
		if errors.Is(err, errShort) {
			return fmt.Errorf("%w: section %s at byte %d", errTruncated, sectionName(id), start)
		}
		if err != nil {
			return fmt.Errorf("section %s at byte %d: size: %w", sectionName(id), start, err)
		}
		if int64(size) > int64(r.remaining()) {
			return fmt.Errorf("%w: section %s at byte %d has %d bytes, but only %d remain", errTruncated, sectionName(id), start, size, r.remaining())
		}
		sec := &wreader{b: r.b[:r.off+int(size)], off: r.off}
		r.off += int(size)
		if err := checkSection(id, sec, maxMemoryPages); err != nil {
			return fmt.Errorf("section %s at byte %d: %w", sectionName(id), start, err)
		}
	}
	return nil
}

// Limits of precheck.
const (
	maxLocals    = 50_000     // per function, as browsers' engines allow
	maxTableSize = 10_000_000 // elements of a table's minimum size
)

func sectionName(id byte) string {
	names := []string{"custom", "type", "import", "function", "table", "memory", "global", "export", "start", "element", "code", "data", "data count"}
	if int(id) < len(names) {
		return names[id]
	}
	return fmt.Sprintf("%d", id)
}

func checkSection(id byte, r *wreader, maxPages uint32) error {
	switch id {
	case 0: // custom: a name, then anything
		_, err := r.name()
		return err
	case 8, 12: // start, data count: one index
		_, err := r.u32()
		return err
	case 1, 2, 3, 4, 5, 6, 7, 9, 10, 11:
	default:
		return fmt.Errorf("unknown section id %d", id)
	}
	n, err := r.count()
	if err != nil {
		return err
	}
	for i := uint32(0); i < n; i++ {
		var err error
		switch id {
		case 1:
			err = r.funcType()
		case 2:
			_, _, err = r.importEntry(maxPages)
		case 4:
			err = r.tableType()
		case 5:
			err = r.memType(maxPages)
		case 7:
			if _, err = r.name(); err == nil {
				if _, err = r.byte(); err == nil {
					_, err = r.u32()
				}
			}
		case 10:
			err = r.codeEntry()
		default:
			// function, global, element, data: the count fits (checked
			// above); their entries are left to wazero, which decodes them
			// with the sizes they actually have.
			return nil
		}
		if err != nil {
			return fmt.Errorf("entry %d of %d: %w", i, n, err)
		}
	}
	return nil
}

// wreader reads the wasm binary format within b.
type wreader struct {
	b   []byte
	off int
}

var (
	errShort     = errors.New("unexpected end")
	errTruncated = errors.New("the module ends inside a section")
)

func (r *wreader) remaining() int { return len(r.b) - r.off }

func (r *wreader) byte() (byte, error) {
	if r.off >= len(r.b) {
		return 0, errShort
	}
	c := r.b[r.off]
	r.off++
	return c, nil
}

// u32 reads an unsigned LEB128 of at most 5 bytes.
func (r *wreader) u32() (uint32, error) {
	var v uint64
	for i := 0; i < 5; i++ {
		c, err := r.byte()
		if err != nil {
			return 0, err
		}
		v |= uint64(c&0x7f) << (7 * i)
		if c&0x80 == 0 {
			if v > 0xFFFFFFFF {
				return 0, fmt.Errorf("LEB128 at byte %d overflows 32 bits", r.off)
			}
			return uint32(v), nil
		}
	}
	return 0, fmt.Errorf("LEB128 at byte %d longer than 5 bytes", r.off)
}

// count reads a vector's length and checks that that many elements of at
// least one byte each fit in what remains.
func (r *wreader) count() (uint32, error) {
	at := r.off
	n, err := r.u32()
	if err != nil {
		return 0, err
	}
	if int64(n) > int64(r.remaining()) {
		return 0, fmt.Errorf("vector at byte %d has %d elements, but only %d bytes remain", at, n, r.remaining())
	}
	return n, nil
}

func (r *wreader) skip(n uint32) error {
	if int64(n) > int64(r.remaining()) {
		return fmt.Errorf("%d bytes at byte %d, but only %d remain", n, r.off, r.remaining())
	}
	r.off += int(n)
	return nil
}

func (r *wreader) name() (uint32, error) {
	n, err := r.count()
	if err == nil {
		err = r.skip(n)
	}
	return n, err
}

func (r *wreader) funcType() error {
	if c, err := r.byte(); err != nil || c != 0x60 {
		if err != nil {
			return err
		}
		return fmt.Errorf("function type at byte %d starts with 0x%02x, want 0x60", r.off-1, c)
	}
	for range 2 { // parameters, results: one byte per value type
		n, err := r.count()
		if err == nil {
			err = r.skip(n)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (r *wreader) limits() (min uint32, err error) {
	flags, err := r.byte()
	if err != nil {
		return 0, err
	}
	if min, err = r.u32(); err != nil {
		return 0, err
	}
	if flags&1 != 0 {
		if _, err = r.u32(); err != nil {
			return 0, err
		}
	}
	return min, nil
}

func (r *wreader) tableType() error {
	if _, err := r.byte(); err != nil { // reference type
		return err
	}
	min, err := r.limits()
	if err == nil && min > maxTableSize {
		err = fmt.Errorf("table of at least %d elements, more than %d", min, maxTableSize)
	}
	return err
}

func (r *wreader) memType(maxPages uint32) error {
	min, err := r.limits()
	if err == nil && maxPages > 0 && min > maxPages {
		err = fmt.Errorf("memory of at least %d pages (%d MiB), more than the memory limit of %d pages", min, uint64(min)*64/1024, maxPages)
	}
	return err
}

// importEntry reads one import and returns its module name and kind.
func (r *wreader) importEntry(maxPages uint32) (module []byte, kind byte, err error) {
	n, err := r.name()
	if err != nil {
		return nil, 0, err
	}
	module = r.b[r.off-int(n) : r.off]
	if _, err := r.name(); err != nil {
		return nil, 0, err
	}
	if kind, err = r.byte(); err != nil {
		return nil, 0, err
	}
	switch kind {
	case 0: // function: a type index
		_, err = r.u32()
	case 1:
		err = r.tableType()
	case 2:
		err = r.memType(maxPages)
	case 3: // global: value type, mutability
		if _, err = r.byte(); err == nil {
			_, err = r.byte()
		}
	default:
		err = fmt.Errorf("import kind 0x%02x", kind)
	}
	return module, kind, err
}

func (r *wreader) codeEntry() error {
	size, err := r.u32()
	if err != nil {
		return err
	}
	if int64(size) > int64(r.remaining()) {
		return fmt.Errorf("function body of %d bytes, but only %d remain", size, r.remaining())
	}
	body := &wreader{b: r.b[:r.off+int(size)], off: r.off}
	r.off += int(size)
	n, err := body.count()
	if err != nil {
		return fmt.Errorf("locals: %w", err)
	}
	var total uint64
	for i := uint32(0); i < n; i++ {
		k, err := body.u32()
		if err != nil {
			return fmt.Errorf("locals: %w", err)
		}
		if _, err := body.byte(); err != nil {
			return fmt.Errorf("locals: %w", err)
		}
		if total += uint64(k); total > maxLocals {
			return fmt.Errorf("more than %d locals in one function", maxLocals)
		}
	}
	return nil
}
