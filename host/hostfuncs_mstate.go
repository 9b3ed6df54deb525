package host

import (
	"encoding/binary"

	"github.com/tetratelabs/wazero/api"

	"github.com/streamd/streamd/abi"
)

// The imports of structured keyed state and processing time (ABI.md
// "Structured keyed state", "Processing time"), additions to version 1.

func addStructuredState(add func(name string, f hostFunc, params, results []api.ValueType, names ...string)) {
	ten := []api.ValueType{i32, i32, i32, i32, i32, i32, i32, i32, i32, i32}
	add(abi.ImportMStateGet, hostMStateGet, ten, []api.ValueType{i32},
		"name_ptr", "name_len", "key_ptr", "key_len", "ns_ptr", "ns_len", "ukey_ptr", "ukey_len", "buf_ptr", "buf_cap")
	add(abi.ImportMStatePut, hostMStatePut, ten, nil,
		"name_ptr", "name_len", "key_ptr", "key_len", "ns_ptr", "ns_len", "ukey_ptr", "ukey_len", "val_ptr", "val_len")
	add(abi.ImportMStateAppend, hostMStateAppend, ten, nil,
		"name_ptr", "name_len", "key_ptr", "key_len", "ns_ptr", "ns_len", "ukey_ptr", "ukey_len", "val_ptr", "val_len")
	add(abi.ImportMStateRemove, hostMStateRemove, ten[:8], nil,
		"name_ptr", "name_len", "key_ptr", "key_len", "ns_ptr", "ns_len", "ukey_ptr", "ukey_len")
	add(abi.ImportMStateEntries, hostMStateEntries, ten[:8], []api.ValueType{i32},
		"name_ptr", "name_len", "key_ptr", "key_len", "ns_ptr", "ns_len", "buf_ptr", "buf_cap")
	add(abi.ImportMStateClear, hostMStateClear, ten[:6], nil,
		"name_ptr", "name_len", "key_ptr", "key_len", "ns_ptr", "ns_len")
	add(abi.ImportStateTTL, hostStateTTL, []api.ValueType{i32, i32, i64, i32}, nil, "name_ptr", "name_len", "ttl_ms", "flags")
	add(abi.ImportPTimerRegister, hostPTimerRegister, []api.ValueType{i32, i32, i64}, nil, "key_ptr", "key_len", "ts")
	add(abi.ImportPTimerDelete, hostPTimerDelete, []api.ValueType{i32, i32, i64}, nil, "key_ptr", "key_len", "ts")
	add(abi.ImportProcessingTime, hostProcessingTime, nil, []api.ValueType{i64})
}

func (i *Instance) requireStateRead(op string) {
	if i.phase == abi.PhaseClose || i.phase == abi.PhaseLoad {
		i.misuse("%s not allowed in phase %s", op, i.phase)
	}
}

// result copies the frame b to the guest's buffer if it fits and returns its length.
func (i *Instance) result(op string, b []byte, ptr, capacity uint32) uint64 {
	if uint32(len(b)) <= capacity {
		copy(i.read(ptr, uint32(len(b)), op, "buffer"), b)
	}
	return api.EncodeI32(int32(len(b)))
}

// mstate_get(name, key, ns, ukey, buf_ptr, buf_cap) -> len | -1
func hostMStateGet(i *Instance, stack []uint64) {
	i.requireStateRead(abi.ImportMStateGet)
	c := i.mcall(abi.ImportMStateGet, stack)
	ukey := i.read(uint32(stack[6]), uint32(stack[7]), abi.ImportMStateGet, "user key")
	v, ok := c.read(ukey, i.now())
	if !ok {
		stack[0] = api.EncodeI32(abi.AbsentLength)
		return
	}
	i.mbuf = appendPayload(i.mbuf[:0], v)
	stack[0] = i.result(abi.ImportMStateGet, i.mbuf, uint32(stack[8]), uint32(stack[9]))
}

// mstate_put(name, key, ns, ukey, val)
func hostMStatePut(i *Instance, stack []uint64) {
	i.requireStateWrite(abi.ImportMStatePut)
	c := i.mcall(abi.ImportMStatePut, stack)
	ukey := i.read(uint32(stack[6]), uint32(stack[7]), abi.ImportMStatePut, "user key")
	val := i.read(uint32(stack[8]), uint32(stack[9]), abi.ImportMStatePut, "value")
	v := append(i.mbuf[:0], entryValue)
	v = binary.LittleEndian.AppendUint64(v, uint64(c.expiry()))
	i.mbuf = append(v, val...)
	c.put(c.storedKey(ukey), i.mbuf)
}

// mstate_append(name, key, ns, ukey, val)
func hostMStateAppend(i *Instance, stack []uint64) {
	i.requireStateWrite(abi.ImportMStateAppend)
	c := i.mcall(abi.ImportMStateAppend, stack)
	ukey := i.read(uint32(stack[6]), uint32(stack[7]), abi.ImportMStateAppend, "user key")
	val := i.read(uint32(stack[8]), uint32(stack[9]), abi.ImportMStateAppend, "value")
	now := i.now()
	old, ok := c.read(ukey, now)
	v := append(i.mbuf[:0], entryList)
	if ok {
		if old[0] != entryList {
			i.misuse("%s: state %s: entry is a value, not a list", abi.ImportMStateAppend, c.name)
		}
		v = append(v, old[1:]...)
	}
	v = binary.LittleEndian.AppendUint64(v, uint64(c.expiry()))
	v = binary.LittleEndian.AppendUint32(v, uint32(len(val)))
	i.mbuf = append(v, val...)
	c.put(c.storedKey(ukey), i.mbuf)
}

// mstate_remove(name, key, ns, ukey)
func hostMStateRemove(i *Instance, stack []uint64) {
	i.requireStateWrite(abi.ImportMStateRemove)
	c := i.mcall(abi.ImportMStateRemove, stack)
	ukey := i.read(uint32(stack[6]), uint32(stack[7]), abi.ImportMStateRemove, "user key")
	c.del(c.storedKey(ukey))
}

// mstate_entries(name, key, ns, buf_ptr, buf_cap) -> len | -1
func hostMStateEntries(i *Instance, stack []uint64) {
	i.requireStateRead(abi.ImportMStateEntries)
	c := i.mcall(abi.ImportMStateEntries, stack)
	ukeys, vals := c.entries(i.now())
	if len(ukeys) == 0 {
		stack[0] = api.EncodeI32(abi.AbsentLength)
		return
	}
	b := binary.LittleEndian.AppendUint32(i.mbuf[:0], uint32(len(ukeys)))
	for n, uk := range ukeys {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(uk)))
		b = append(b, uk...)
		at := len(b)
		b = append(b, 0, 0, 0, 0)
		b = appendPayload(b, vals[n])
		binary.LittleEndian.PutUint32(b[at:], uint32(len(b)-at-4))
	}
	i.mbuf = b
	stack[0] = i.result(abi.ImportMStateEntries, b, uint32(stack[6]), uint32(stack[7]))
}

// mstate_clear(name, key, ns)
func hostMStateClear(i *Instance, stack []uint64) {
	i.requireStateWrite(abi.ImportMStateClear)
	c := i.mcall(abi.ImportMStateClear, stack)
	var ukeys [][]byte
	err := i.state.scan(c.kg, c.sname, c.prefix, func(ukey, _ []byte) error {
		ukeys = append(ukeys, append([]byte(nil), ukey...))
		return nil
	})
	if err != nil {
		i.stateFailed(abi.ImportMStateClear, err)
	}
	for _, uk := range ukeys {
		c.del(c.storedKey(uk))
	}
}

// state_ttl(name, ttl_ms i64, flags): open only.
func hostStateTTL(i *Instance, stack []uint64) {
	if i.phase != abi.PhaseOpen {
		i.misuse("%s not allowed in phase %s (only in open)", abi.ImportStateTTL, i.phase)
	}
	name := i.read(uint32(stack[0]), uint32(stack[1]), abi.ImportStateTTL, "name")
	ms, flags := int64(stack[2]), int32(uint32(stack[3]))
	if ms < 0 {
		i.misuse("%s: state %q: negative ttl %d ms", abi.ImportStateTTL, name, ms)
	}
	if flags&^abi.TTLUpdateOnRead != 0 {
		i.misuse("%s: state %q: unknown flags %#x", abi.ImportStateTTL, name, flags)
	}
	if i.ttl == nil {
		i.ttl = map[string]ttlConfig{}
	}
	if ms == 0 {
		delete(i.ttl, string(name))
		return
	}
	i.ttl[string(name)] = ttlConfig{ms: ms, updateOnRead: flags&abi.TTLUpdateOnRead != 0}
}

// ptimer_register(key_ptr, key_len, ts i64)
func hostPTimerRegister(i *Instance, stack []uint64) {
	i.ptimer(abi.ImportPTimerRegister, stack, true)
}

// ptimer_delete(key_ptr, key_len, ts i64)
func hostPTimerDelete(i *Instance, stack []uint64) {
	i.ptimer(abi.ImportPTimerDelete, stack, false)
}

func (i *Instance) ptimer(op string, stack []uint64, register bool) {
	i.requireStateWrite(op)
	key := i.read(uint32(stack[0]), uint32(stack[1]), op, "key")
	i.keyGroup(op, key)
	ts := int64(stack[2])
	i.journalTimer(op, procTime, key, ts)
	var err error
	if register {
		err = i.state.registerTimer(procTime, key, ts)
	} else {
		err = i.state.deleteTimer(procTime, key, ts)
	}
	if err != nil {
		i.stateFailed(op, err)
	}
}

// processing_time() -> i64: only with allow_clock.
func hostProcessingTime(i *Instance, stack []uint64) {
	if !i.clockAllowed() {
		i.misuse("%s needs allow_clock: true (job file)", abi.ImportProcessingTime)
	}
	stack[0] = uint64(i.now())
}
