;; The structured-state conformance operator (guests/SPEC.md, "mstate"),
;; hand-written in WAT from abi/ABI.md: each record's value is a command
;; on structured keyed state or processing-time timers of the record's key.
;;
;; value = u8 op, then up to 4 fields, each u32le len + bytes. Results are
;; emitted as one record (key, op ++ result, ts).
(module
  (import "streamd_v1" "emit" (func $emit (param i32 i32)))
  (import "streamd_v1" "mstate_get" (func $mget (param i32 i32 i32 i32 i32 i32 i32 i32 i32 i32) (result i32)))
  (import "streamd_v1" "mstate_put" (func $mput (param i32 i32 i32 i32 i32 i32 i32 i32 i32 i32)))
  (import "streamd_v1" "mstate_append" (func $mappend (param i32 i32 i32 i32 i32 i32 i32 i32 i32 i32)))
  (import "streamd_v1" "mstate_remove" (func $mremove (param i32 i32 i32 i32 i32 i32 i32 i32)))
  (import "streamd_v1" "mstate_entries" (func $mentries (param i32 i32 i32 i32 i32 i32 i32 i32) (result i32)))
  (import "streamd_v1" "mstate_clear" (func $mclear (param i32 i32 i32 i32 i32 i32)))
  (import "streamd_v1" "state_ttl" (func $state_ttl (param i32 i32 i64 i32)))
  (import "streamd_v1" "ptimer_register" (func $ptimer_register (param i32 i32 i64)))
  (import "streamd_v1" "ptimer_delete" (func $ptimer_delete (param i32 i32 i64)))
  (import "streamd_v1" "processing_time" (func $processing_time (result i64)))
  (import "streamd_v1" "state_put" (func $state_put (param i32 i32 i32 i32 i32 i32)))
  (import "streamd_v1" "reject" (func $reject (param i32 i32)))

  (memory (export "memory") 2)

  (data (i32.const 16) "ttl")
  (data (i32.const 32) "ttlr")
  (data (i32.const 48) "pt")
  (data (i32.const 64) "mstate reject")
  ;; 256: the fields of the current command, 4 x (ptr i32, len i32)

  (global $heap (mut i32) (i32.const 4096))  ;; bump pointer
  (global $out (mut i32) (i32.const 0))      ;; output frame buffer
  (global $out_cap (mut i32) (i32.const 0))

  (func (export "streamd_abi_version") (result i32) (i32.const 1))

  ;; Bump allocator: 8-byte aligned, grows memory; 0 when memory cannot grow.
  (func $alloc (export "streamd_alloc") (param $size i32) (result i32)
    (local $ptr i32) (local $end i32) (local $have i32)
    (local.set $ptr (i32.and (i32.add (global.get $heap) (i32.const 7)) (i32.const -8)))
    (local.set $end (i32.add (local.get $ptr) (local.get $size)))
    (if (i32.lt_u (local.get $end) (local.get $ptr)) (then (return (i32.const 0))))
    (local.set $have (i32.mul (memory.size) (i32.const 65536)))
    (if (i32.gt_u (local.get $end) (local.get $have))
      (then
        (if (i32.eq
              (memory.grow (i32.shr_u (i32.add (i32.sub (local.get $end) (local.get $have)) (i32.const 65535)) (i32.const 16)))
              (i32.const -1))
          (then (return (i32.const 0))))))
    (global.set $heap (local.get $end))
    (local.get $ptr))

  ;; $need_out: the output buffer holds at least n bytes.
  (func $need_out (param $n i32)
    (if (i32.gt_u (local.get $n) (global.get $out_cap))
      (then
        (global.set $out_cap (i32.add (local.get $n) (i32.const 256)))
        (global.set $out (call $alloc (global.get $out_cap)))
        (if (i32.eqz (global.get $out)) (then unreachable)))))

  ;; $head: writes the header of a one-record frame (ts, key) with a value
  ;; of vl bytes into the output buffer (at least 20+kl+vl bytes) and emits it.
  (func $send (param $ts i64) (param $kp i32) (param $kl i32) (param $vl i32)
    (local $s i32)
    (local.set $s (global.get $out))
    (i32.store (local.get $s) (i32.const 1))
    (i64.store offset=4 (local.get $s) (local.get $ts))
    (i32.store offset=12 (local.get $s) (local.get $kl))
    (memory.copy (i32.add (local.get $s) (i32.const 16)) (local.get $kp) (local.get $kl))
    (i32.store offset=16 (i32.add (local.get $s) (local.get $kl)) (local.get $vl))
    (call $emit (local.get $s) (i32.add (i32.const 20) (i32.add (local.get $kl) (local.get $vl)))))

  ;; where the value of the output frame goes, for key length kl
  (func $val (param $kl i32) (result i32)
    (i32.add (i32.add (global.get $out) (i32.const 20)) (local.get $kl)))

  (func $fp (param $i i32) (result i32) (i32.load (i32.add (i32.const 256) (i32.shl (local.get $i) (i32.const 3)))))
  (func $fl (param $i i32) (result i32) (i32.load (i32.add (i32.const 260) (i32.shl (local.get $i) (i32.const 3)))))

  ;; parses the fields of a command [p, end) into the table at 256
  (func $fields (param $p i32) (param $end i32)
    (local $i i32) (local $l i32)
    (memory.fill (i32.const 256) (i32.const 0) (i32.const 32))
    (block $done
      (loop $next
        (br_if $done (i32.ge_u (local.get $i) (i32.const 4)))
        (br_if $done (i32.gt_u (i32.add (local.get $p) (i32.const 4)) (local.get $end)))
        (local.set $l (i32.load (local.get $p)))
        (i32.store (i32.add (i32.const 256) (i32.shl (local.get $i) (i32.const 3))) (i32.add (local.get $p) (i32.const 4)))
        (i32.store (i32.add (i32.const 260) (i32.shl (local.get $i) (i32.const 3))) (local.get $l))
        (local.set $p (i32.add (i32.add (local.get $p) (i32.const 4)) (local.get $l)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $next))))

  (func (export "streamd_open") (param i32 i32) (result i32)
    (call $need_out (i32.const 256))
    (call $state_ttl (i32.const 16) (i32.const 3) (i64.const 100) (i32.const 0))
    (call $state_ttl (i32.const 32) (i32.const 4) (i64.const 100) (i32.const 1))
    (i32.const 0))

  ;; $result emits (key, op ++ i32le(n) ++ result) for a get ('g') or an
  ;; entries ('e') call: it calls with the room left in the output buffer,
  ;; and again with a buffer of n bytes when the result did not fit.
  (func $result (param $op i32) (param $ts i64) (param $kp i32) (param $kl i32) (result i32)
    (local $n i32) (local $cap i32)
    (local.set $cap (i32.sub (global.get $out_cap) (i32.add (local.get $kl) (i32.const 25))))
    (local.set $n (call $lookup (local.get $op) (local.get $kp) (local.get $kl) (i32.add (call $val (local.get $kl)) (i32.const 5)) (local.get $cap)))
    (if (i32.gt_s (local.get $n) (local.get $cap))
      (then
        (call $need_out (i32.add (local.get $n) (i32.add (local.get $kl) (i32.const 25))))
        (local.set $n (call $lookup (local.get $op) (local.get $kp) (local.get $kl) (i32.add (call $val (local.get $kl)) (i32.const 5)) (local.get $n)))))
    (i32.store8 (call $val (local.get $kl)) (local.get $op))
    (i32.store offset=1 (call $val (local.get $kl)) (local.get $n))
    (call $send (local.get $ts) (local.get $kp) (local.get $kl)
      (i32.add (i32.const 5) (select (local.get $n) (i32.const 0) (i32.gt_s (local.get $n) (i32.const 0)))))
    (i32.const 0))

  (func $lookup (param $op i32) (param $kp i32) (param $kl i32) (param $buf i32) (param $cap i32) (result i32)
    (if (result i32) (i32.eq (local.get $op) (i32.const 0x67)) ;; 'g'
      (then
        (call $mget (call $fp (i32.const 0)) (call $fl (i32.const 0)) (local.get $kp) (local.get $kl)
          (call $fp (i32.const 1)) (call $fl (i32.const 1)) (call $fp (i32.const 2)) (call $fl (i32.const 2))
          (local.get $buf) (local.get $cap)))
      (else
        (call $mentries (call $fp (i32.const 0)) (call $fl (i32.const 0)) (local.get $kp) (local.get $kl)
          (call $fp (i32.const 1)) (call $fl (i32.const 1)) (local.get $buf) (local.get $cap)))))

  ;; process(input, batch_ptr, batch_len)
  (func (export "streamd_process") (param $input i32) (param $ptr i32) (param $len i32) (result i32)
    (local $n i32) (local $p i32) (local $ts i64) (local $kp i32) (local $kl i32) (local $vp i32) (local $vl i32)
    (local $op i32)
    (local.set $n (i32.load (local.get $ptr)))
    (local.set $p (i32.add (local.get $ptr) (i32.const 4)))
    (block $done
      (loop $next
        (br_if $done (i32.eqz (local.get $n)))
        (local.set $n (i32.sub (local.get $n) (i32.const 1)))
        (local.set $ts (i64.load (local.get $p)))
        (local.set $kl (i32.load offset=8 (local.get $p)))
        (local.set $kp (i32.add (local.get $p) (i32.const 12)))
        (local.set $vl (i32.load (i32.add (local.get $kp) (local.get $kl))))
        (local.set $vp (i32.add (i32.add (local.get $kp) (local.get $kl)) (i32.const 4)))
        (local.set $p (i32.add (local.get $vp) (local.get $vl)))
        (br_if $next (i32.eqz (local.get $vl)))
        (local.set $op (i32.load8_u (local.get $vp)))
        (call $fields (i32.add (local.get $vp) (i32.const 1)) (i32.add (local.get $vp) (local.get $vl)))
        (call $need_out (i32.add (local.get $kl) (i32.const 64)))

        (block $cmd
          ;; 'g' get(name, ns, ukey), 'e' entries(name, ns): emit the result
          (if (i32.or (i32.eq (local.get $op) (i32.const 0x67)) (i32.eq (local.get $op) (i32.const 0x65)))
            (then (drop (call $result (local.get $op) (local.get $ts) (local.get $kp) (local.get $kl))) (br $cmd)))
          ;; 'p' put(name, ns, ukey, val)
          (if (i32.eq (local.get $op) (i32.const 0x70))
            (then
              (call $mput (call $fp (i32.const 0)) (call $fl (i32.const 0)) (local.get $kp) (local.get $kl)
                (call $fp (i32.const 1)) (call $fl (i32.const 1)) (call $fp (i32.const 2)) (call $fl (i32.const 2))
                (call $fp (i32.const 3)) (call $fl (i32.const 3)))
              (br $cmd)))
          ;; 'a' append(name, ns, ukey, val)
          (if (i32.eq (local.get $op) (i32.const 0x61))
            (then
              (call $mappend (call $fp (i32.const 0)) (call $fl (i32.const 0)) (local.get $kp) (local.get $kl)
                (call $fp (i32.const 1)) (call $fl (i32.const 1)) (call $fp (i32.const 2)) (call $fl (i32.const 2))
                (call $fp (i32.const 3)) (call $fl (i32.const 3)))
              (br $cmd)))
          ;; 'r' remove(name, ns, ukey)
          (if (i32.eq (local.get $op) (i32.const 0x72))
            (then
              (call $mremove (call $fp (i32.const 0)) (call $fl (i32.const 0)) (local.get $kp) (local.get $kl)
                (call $fp (i32.const 1)) (call $fl (i32.const 1)) (call $fp (i32.const 2)) (call $fl (i32.const 2)))
              (br $cmd)))
          ;; 'c' clear(name, ns)
          (if (i32.eq (local.get $op) (i32.const 0x63))
            (then
              (call $mclear (call $fp (i32.const 0)) (call $fl (i32.const 0)) (local.get $kp) (local.get $kl)
                (call $fp (i32.const 1)) (call $fl (i32.const 1)))
              (br $cmd)))
          ;; 'P' ptimer_register(ts i64le), 'D' ptimer_delete(ts i64le)
          (if (i32.eq (local.get $op) (i32.const 0x50))
            (then (call $ptimer_register (local.get $kp) (local.get $kl) (i64.load (call $fp (i32.const 0)))) (br $cmd)))
          (if (i32.eq (local.get $op) (i32.const 0x44))
            (then (call $ptimer_delete (local.get $kp) (local.get $kl) (i64.load (call $fp (i32.const 0)))) (br $cmd)))
          ;; 'n': emit (key, 'n' ++ i64le(processing_time()))
          (if (i32.eq (local.get $op) (i32.const 0x6e))
            (then
              (i32.store8 (call $val (local.get $kl)) (i32.const 0x6e))
              (i64.store offset=1 (call $val (local.get $kl)) (call $processing_time))
              (call $send (local.get $ts) (local.get $kp) (local.get $kl) (i32.const 9))
              (br $cmd)))
          ;; 'o' state_put(name, key, val): the old import
          (if (i32.eq (local.get $op) (i32.const 0x6f))
            (then
              (call $state_put (call $fp (i32.const 0)) (call $fl (i32.const 0)) (local.get $kp) (local.get $kl)
                (call $fp (i32.const 1)) (call $fl (i32.const 1)))
              (br $cmd)))
          ;; 't' (name, i64le ttl): state_ttl(name, ttl, 0), outside open (misuse)
          (if (i32.eq (local.get $op) (i32.const 0x74))
            (then
              (call $state_ttl (call $fp (i32.const 0)) (call $fl (i32.const 0)) (i64.load (call $fp (i32.const 1))) (i32.const 0))
              (br $cmd)))
          ;; 'x': reject the record
          (if (i32.eq (local.get $op) (i32.const 0x78))
            (then
              (call $reject (i32.const 64) (i32.const 13))
              (return (i32.const 3))))
          unreachable)
        (br $next)))
    (i32.const 0))

  ;; on_processing_time(ts, key): emit (key, "pt" ++ i64le(ts), ts)
  (func (export "streamd_on_processing_time") (param $ts i64) (param $kp i32) (param $kl i32) (result i32)
    (call $need_out (i32.add (local.get $kl) (i32.const 64)))
    (memory.copy (call $val (local.get $kl)) (i32.const 48) (i32.const 2))
    (i64.store offset=2 (call $val (local.get $kl)) (local.get $ts))
    (call $send (local.get $ts) (local.get $kp) (local.get $kl) (i32.const 10))
    (i32.const 0))

  (func (export "streamd_close") (result i32) (i32.const 0))
)
