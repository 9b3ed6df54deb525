package host

import (
	"encoding/binary"
	"fmt"

	"github.com/streamd/streamd/abi"
)

// Structured keyed state (mstate_* imports, ABI.md "Structured keyed
// state"). An entry (name, key, ns, ukey) is stored in the keyed-state map
// of the backends like any state_put value, under
//
//	stored name: NUL name
//	stored key:  u32be(len key) key u32be(len ns) ns ukey
//
// so that the entries of (name, key, ns) share a prefix (a pebble prefix
// scan; the memory backend indexes them), and the key group is that of the
// embedded key. The stored value carries the entry's kind and expiry
// (little-endian):
//
//	value entry: u8 1, i64 expiry, value bytes
//	list entry:  u8 2, then per element in append order: i64 expiry, u32 len, bytes
//
// An expiry is the host processing time (ms) from which the entry (or list
// element) is dead; 0: it never expires.
const (
	entryValue = 1
	entryList  = 2

	valueHeader = 1 + 8 // kind, expiry
	elemHeader  = 8 + 4 // expiry, length
)

// timerKind says which timers a backend call is about.
type timerKind uint8

const (
	eventTime timerKind = iota // timer_register: fires by watermark
	procTime                   // ptimer_register: fires by the host's processing time
	numTimerKinds
)

// isStructured: a stored state name of the mstate_* imports.
func isStructured(name []byte) bool { return len(name) > 0 && name[0] == 0 }

// appendEntryPrefix appends the stored-key prefix of (key, ns).
func appendEntryPrefix(b, key, ns []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(key)))
	b = append(b, key...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(ns)))
	return append(b, ns...)
}

// splitEntryKey splits a stored key into its (key, ns) prefix and user key.
func splitEntryKey(k []byte) (prefix, ukey []byte, ok bool) {
	if len(k) < 4 {
		return nil, nil, false
	}
	n := 4 + int(binary.BigEndian.Uint32(k))
	if n+4 > len(k) || n < 4 {
		return nil, nil, false
	}
	m := n + 4 + int(binary.BigEndian.Uint32(k[n:]))
	if m > len(k) || m < n+4 {
		return nil, nil, false
	}
	return k[:m], k[m:], true
}

// embeddedKey is the record key inside a stored key.
func embeddedKey(k []byte) ([]byte, bool) {
	if _, _, ok := splitEntryKey(k); !ok {
		return nil, false
	}
	return k[4 : 4+binary.BigEndian.Uint32(k)], true
}

// storedKeyGroup is the key group of stored key k of stored state name: of
// the embedded key for structured state, else of k itself.
func storedKeyGroup(name, k []byte, maxP int) (int, error) {
	if !isStructured(name) {
		return abi.KeyGroup(k, maxP), nil
	}
	key, ok := embeddedKey(k)
	if !ok || len(key) == 0 {
		return 0, fmt.Errorf("host: restored structured state %q has a malformed stored key %q", name[1:], k)
	}
	return abi.KeyGroup(key, maxP), nil
}

// valueExpires: the stored structured value v carries an expiry.
func valueExpires(v []byte) bool {
	if len(v) < 1 {
		return false
	}
	switch v[0] {
	case entryValue:
		return len(v) >= valueHeader && binary.LittleEndian.Uint64(v[1:]) != 0
	case entryList:
		for p := 1; p+elemHeader <= len(v); {
			if binary.LittleEndian.Uint64(v[p:]) != 0 {
				return true
			}
			p += elemHeader + int(binary.LittleEndian.Uint32(v[p+8:]))
		}
	}
	return false
}

func expired(exp, now int64) bool { return exp != 0 && now >= exp }

// liveValue is the stored value v without what expired at now: v itself
// when nothing did, a trimmed copy of a list whose elements expired in
// part, keep false when the whole entry did (or v is malformed).
func liveValue(v []byte, now int64) (live []byte, keep bool) {
	if len(v) < 1 {
		return nil, false
	}
	switch v[0] {
	case entryValue:
		if len(v) < valueHeader || expired(int64(binary.LittleEndian.Uint64(v[1:])), now) {
			return nil, false
		}
		return v, true
	case entryList:
		var out []byte
		n, p := 0, 1
		for p+elemHeader <= len(v) {
			end := p + elemHeader + int(binary.LittleEndian.Uint32(v[p+8:]))
			if end > len(v) || end < p {
				return nil, false
			}
			if expired(int64(binary.LittleEndian.Uint64(v[p:])), now) {
				if out == nil {
					out = append(make([]byte, 0, len(v)), v[:p]...)
				}
			} else {
				n++
				if out != nil {
					out = append(out, v[p:end]...)
				}
			}
			p = end
		}
		if n == 0 {
			return nil, false
		}
		if out == nil {
			return v, true
		}
		return out, true
	}
	return nil, false
}

// liveStored is liveValue for structured state name, and v itself for
// any other: what a cut at now keeps of a stored value.
func liveStored(name, v []byte, now int64) ([]byte, bool) {
	if !isStructured(name) {
		return v, true
	}
	return liveValue(v, now)
}

// withExpiry rewrites the expiry of a live stored value (and of every
// element of a list) to exp, in place in a copy.
func withExpiry(v []byte, exp int64) []byte {
	out := append([]byte(nil), v...)
	switch out[0] {
	case entryValue:
		binary.LittleEndian.PutUint64(out[1:], uint64(exp))
	case entryList:
		for p := 1; p+elemHeader <= len(out); p += elemHeader + int(binary.LittleEndian.Uint32(out[p+8:])) {
			binary.LittleEndian.PutUint64(out[p:], uint64(exp))
		}
	}
	return out
}

// appendPayload appends what mstate_get returns for the live stored value
// v: the value, or the list frame u32 count, count x (u32 len, bytes).
func appendPayload(b, v []byte) []byte {
	if v[0] == entryValue {
		return append(b, v[valueHeader:]...)
	}
	start := len(b)
	b = append(b, 0, 0, 0, 0)
	n := uint32(0)
	for p := 1; p+elemHeader <= len(v); {
		l := int(binary.LittleEndian.Uint32(v[p+8:]))
		b = binary.LittleEndian.AppendUint32(b, uint32(l))
		b = append(b, v[p+elemHeader:p+elemHeader+l]...)
		p += elemHeader + l
		n++
	}
	binary.LittleEndian.PutUint32(b[start:], n)
	return b
}

// ttlConfig is what state_ttl set for one state.
type ttlConfig struct {
	ms           int64
	updateOnRead bool
}

// mstateCall is one mstate_* import call (reused by the instance).
type mstateCall struct {
	i      *Instance
	op     string // the import, for errors and the journal
	name   []byte // the state name as the guest gave it
	sname  []byte // stored name: NUL name
	kg     int
	prefix []byte // the stored-key prefix of (key, ns)
}

// mcall reads name, key and ns of an mstate import from the guest and
// checks the key.
func (i *Instance) mcall(op string, stack []uint64) *mstateCall {
	c := &i.mst
	c.i, c.op = i, op
	c.name = i.read(uint32(stack[0]), uint32(stack[1]), op, "name")
	key := i.read(uint32(stack[2]), uint32(stack[3]), op, "key")
	ns := i.read(uint32(stack[4]), uint32(stack[5]), op, "namespace")
	c.kg = i.keyGroup(op, key)
	c.sname = append(append(c.sname[:0], 0), c.name...)
	c.prefix = appendEntryPrefix(c.prefix[:0], key, ns)
	return c
}

// storedKey is the stored key of user key ukey (reusing a scratch buffer).
func (c *mstateCall) storedKey(ukey []byte) []byte {
	c.i.mkey = append(append(c.i.mkey[:0], c.prefix...), ukey...)
	return c.i.mkey
}

func (c *mstateCall) ttl() ttlConfig { return c.i.ttl[string(c.name)] }

// expiry is the expiry of an entry written now.
func (c *mstateCall) expiry() int64 {
	if t := c.ttl(); t.ms > 0 {
		return c.i.now() + t.ms
	}
	return 0
}

func (c *mstateCall) put(key, v []byte) {
	i := c.i
	i.journalEntry(c.op, c.kg, c.sname, key)
	if err := i.state.put(c.kg, c.sname, key, v); err != nil {
		i.stateFailed(c.op, err)
	}
}

func (c *mstateCall) del(key []byte) {
	i := c.i
	i.journalEntry(c.op, c.kg, c.sname, key)
	if err := i.state.del(c.kg, c.sname, key); err != nil {
		i.stateFailed(c.op, err)
	}
}

// read returns the live stored value of ukey, dropping what expired and
// refreshing the expiry on read if the state's TTL says so. The value is
// valid until the next backend call.
func (c *mstateCall) read(ukey []byte, now int64) ([]byte, bool) {
	key := c.storedKey(ukey)
	v, ok, err := c.i.state.get(c.kg, c.sname, key)
	if err != nil {
		c.i.stateFailed(c.op, err)
	}
	if !ok {
		return nil, false
	}
	if live, keep := liveValue(v, now); keep && len(live) == len(v) && !c.refreshes() {
		return v, true // nothing to write back: v as the backend lent it
	}
	// A copy: the journal and write-backs read the backend again.
	return c.touch(key, append([]byte(nil), v...), now)
}

// refreshes: reads write the entries back with a new expiry.
func (c *mstateCall) refreshes() bool {
	t := c.ttl()
	return t.ms > 0 && t.updateOnRead && c.writable()
}

// touch applies expiry to the stored value v of key as a read finds it.
func (c *mstateCall) touch(key, v []byte, now int64) ([]byte, bool) {
	live, keep := liveValue(v, now)
	if !keep {
		if c.writable() {
			c.del(key)
		}
		return nil, false
	}
	if c.refreshes() {
		live = withExpiry(live, now+c.ttl().ms)
		c.put(key, live)
		return live, true
	}
	if len(live) != len(v) && c.writable() {
		c.put(key, live) // elements expired: store the rest
	}
	return live, true
}

// writable: reads may write back (drop expired entries, refresh expiries)
// in the phases that allow writes.
func (c *mstateCall) writable() bool { return c.i.writesAllowed() }

// entries returns the live entries of (name, key, ns) by user key.
func (c *mstateCall) entries(now int64) (ukeys, vals [][]byte) {
	type found struct{ ukey, val []byte }
	var all []found
	err := c.i.state.scan(c.kg, c.sname, c.prefix, func(ukey, val []byte) error {
		all = append(all, found{append([]byte(nil), ukey...), append([]byte(nil), val...)})
		return nil
	})
	if err != nil {
		c.i.stateFailed(c.op, err)
	}
	for _, f := range all {
		key := append(append([]byte(nil), c.prefix...), f.ukey...)
		if v, ok := c.touch(key, f.val, now); ok {
			ukeys, vals = append(ukeys, f.ukey), append(vals, v)
		}
	}
	return ukeys, vals
}

// checkStateName refuses, in the old state_* imports, names that start
// with NUL: those are the stored names of structured state.
func (i *Instance) checkStateName(op string, name []byte) {
	if isStructured(name) {
		i.misuse("%s: state name %q starts with a NUL byte (reserved for the mstate_* imports)", op, name)
	}
}
