;; The streamd conformance operator, hand-written in WAT from abi/ABI.md alone;
;; behaviour as specified for the conformance suite (same in Go, Rust and WAT).
;; It emits one record per emit call and keeps its own bump allocator.
(module
  (import "streamd_v1" "emit" (func $emit (param i32 i32)))
  (import "streamd_v1" "state_get" (func $state_get (param i32 i32 i32 i32 i32 i32) (result i32)))
  (import "streamd_v1" "state_put" (func $state_put (param i32 i32 i32 i32 i32 i32)))
  (import "streamd_v1" "state_delete" (func $state_delete (param i32 i32 i32 i32)))
  (import "streamd_v1" "list_state_add" (func $list_state_add (param i32 i32 i32 i32 i32)))
  (import "streamd_v1" "list_state_get" (func $list_state_get (param i32 i32 i32 i32 i32) (result i32)))
  (import "streamd_v1" "timer_register" (func $timer_register (param i32 i32 i64)))
  (import "streamd_v1" "log" (func $log (param i32 i32 i32)))
  (import "streamd_v1" "fail" (func $fail (param i32 i32)))
  (import "streamd_v1" "reject" (func $reject (param i32 i32)))

  (memory (export "memory") 1)

  ;; constant strings
  (data (i32.const 16) "count")
  (data (i32.const 32) "total")
  (data (i32.const 48) "ckpt")
  (data (i32.const 64) "conformance: fail in open")
  (data (i32.const 96) "open")
  (data (i32.const 112) "notify")
  (data (i32.const 128) "close")
  (data (i32.const 144) "conformance panic")
  (data (i32.const 176) "panic")
  (data (i32.const 192) "oob")
  (data (i32.const 208) "spin")
  (data (i32.const 224) "grow")
  (data (i32.const 240) "timer")
  (data (i32.const 256) "del")
  (data (i32.const 272) "wm")
  (data (i32.const 288) "end")
  (data (i32.const 304) "finish")
  (data (i32.const 320) "fail_in")
  (data (i32.const 336) "reject")
  (data (i32.const 352) "conformance reject")
  ;; 512: 8-byte buffer for state and list state values

  (global $heap (mut i32) (i32.const 1024))     ;; bump pointer
  (global $scratch (mut i32) (i32.const 0))     ;; emit frame buffer
  (global $scratch_cap (mut i32) (i32.const 0))
  (global $frame_len (mut i32) (i32.const 0))
  (global $total (mut i64) (i64.const 0))

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

  ;; $eq: bytes [p, p+n) equal the constant [s, s+sn)?
  (func $eq (param $p i32) (param $n i32) (param $s i32) (param $sn i32) (result i32)
    (local $i i32)
    (if (i32.ne (local.get $n) (local.get $sn)) (then (return (i32.const 0))))
    (block $done
      (loop $next
        (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        (if (i32.ne (i32.load8_u (i32.add (local.get $p) (local.get $i)))
                    (i32.load8_u (i32.add (local.get $s) (local.get $i))))
          (then (return (i32.const 0))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $next)))
    (i32.const 1))

  ;; $frame: starts a one-record batch frame (ts, key, value of vlen bytes) in
  ;; the scratch buffer; returns where the value bytes go. Emit with $send.
  (func $frame (param $ts i64) (param $kp i32) (param $kl i32) (param $vl i32) (result i32)
    (local $need i32) (local $s i32)
    (local.set $need (i32.add (i32.const 20) (i32.add (local.get $kl) (local.get $vl))))
    (if (i32.gt_u (local.get $need) (global.get $scratch_cap))
      (then
        (global.set $scratch_cap (i32.add (local.get $need) (i32.const 4096)))
        (global.set $scratch (call $alloc (global.get $scratch_cap)))
        (if (i32.eqz (global.get $scratch)) (then unreachable))))
    (local.set $s (global.get $scratch))
    (i32.store (local.get $s) (i32.const 1))
    (i64.store offset=4 (local.get $s) (local.get $ts))
    (i32.store offset=12 (local.get $s) (local.get $kl))
    (memory.copy (i32.add (local.get $s) (i32.const 16)) (local.get $kp) (local.get $kl))
    (i32.store offset=16 (i32.add (local.get $s) (local.get $kl)) (local.get $vl))
    (global.set $frame_len (local.get $need))
    (i32.add (i32.add (local.get $s) (i32.const 20)) (local.get $kl)))

  (func $send
    (call $emit (global.get $scratch) (global.get $frame_len)))

  ;; emits (key, constant string, ts)
  (func $emit_const (param $ts i64) (param $kp i32) (param $kl i32) (param $sp i32) (param $sl i32)
    (memory.copy (call $frame (local.get $ts) (local.get $kp) (local.get $kl) (local.get $sl)) (local.get $sp) (local.get $sl))
    (call $send))

  ;; open(ctx_ptr, ctx_len)
  (func (export "streamd_open") (param $ctx i32) (param $len i32) (result i32)
    (local $p i32) (local $n i32) (local $kl i32) (local $vl i32) (local $idx i32) (local $r i32)
    ;; total := sum of restored list state "total"
    (global.set $total (i64.const 0))
    (block $done
      (loop $next
        (local.set $r (call $list_state_get (i32.const 32) (i32.const 5) (local.get $idx) (i32.const 512) (i32.const 8)))
        (br_if $done (i32.eq (local.get $r) (i32.const -1)))
        (if (i32.eq (local.get $r) (i32.const 8))
          (then (global.set $total (i64.add (global.get $total) (i64.load (i32.const 512))))))
        (local.set $idx (i32.add (local.get $idx) (i32.const 1)))
        (br $next)))
    ;; skip the 7 fixed u32 fields, job and operator
    (local.set $p (i32.add (local.get $ctx) (i32.const 28)))
    (local.set $p (i32.add (i32.add (local.get $p) (i32.const 4)) (i32.load (local.get $p))))
    (local.set $p (i32.add (i32.add (local.get $p) (i32.const 4)) (i32.load (local.get $p))))
    (local.set $n (i32.load (local.get $p)))
    (local.set $p (i32.add (local.get $p) (i32.const 4)))
    (block $cfg_done
      (loop $cfg
        (br_if $cfg_done (i32.eqz (local.get $n)))
        (local.set $kl (i32.load (local.get $p)))
        (local.set $vl (i32.load (i32.add (i32.add (local.get $p) (i32.const 4)) (local.get $kl))))
        (if (i32.and
              (call $eq (i32.add (local.get $p) (i32.const 4)) (local.get $kl) (i32.const 320) (i32.const 7))
              (call $eq (i32.add (i32.add (local.get $p) (i32.const 8)) (local.get $kl)) (local.get $vl) (i32.const 96) (i32.const 4)))
          (then (call $fail (i32.const 64) (i32.const 25))))
        (local.set $p (i32.add (i32.add (local.get $p) (i32.const 8)) (i32.add (local.get $kl) (local.get $vl))))
        (local.set $n (i32.sub (local.get $n) (i32.const 1)))
        (br $cfg)))
    (call $log (i32.const 1) (i32.const 96) (i32.const 4))
    (i32.const 0))

  ;; process(input, batch_ptr, batch_len)
  (func (export "streamd_process") (param $input i32) (param $ptr i32) (param $len i32) (result i32)
    (local $n i32) (local $p i32) (local $ts i64) (local $kp i32) (local $kl i32) (local $vp i32) (local $vl i32)
    (local $count i64) (local $out i32)
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

        (if (call $eq (local.get $vp) (local.get $vl) (i32.const 176) (i32.const 5))
          (then (call $fail (i32.const 144) (i32.const 17))))
        (if (call $eq (local.get $vp) (local.get $vl) (i32.const 336) (i32.const 6))
          (then
            (call $reject (i32.const 352) (i32.const 18))
            (return (i32.const 3))))
        (if (call $eq (local.get $vp) (local.get $vl) (i32.const 192) (i32.const 3))
          (then (drop (i32.load8_u (i32.const 0xFFFFFFF0)))))
        (if (call $eq (local.get $vp) (local.get $vl) (i32.const 208) (i32.const 4))
          (then (loop $spin (br $spin))))
        (if (call $eq (local.get $vp) (local.get $vl) (i32.const 224) (i32.const 4))
          (then
            (loop $grow
              (br_if $grow (i32.ne (memory.grow (i32.const 16)) (i32.const -1))))
            unreachable))
        (if (call $eq (local.get $vp) (local.get $vl) (i32.const 240) (i32.const 5))
          (then (call $timer_register (local.get $kp) (local.get $kl) (i64.add (local.get $ts) (i64.const 10)))))
        (if (call $eq (local.get $vp) (local.get $vl) (i32.const 256) (i32.const 3))
          (then
            (call $state_delete (i32.const 16) (i32.const 5) (local.get $kp) (local.get $kl))
            (call $emit_const (local.get $ts) (local.get $kp) (local.get $kl) (i32.const 256) (i32.const 3))
            (br $next)))

        ;; count := state_get("count", k) + 1
        (local.set $count (i64.const 0))
        (if (i32.eq (call $state_get (i32.const 16) (i32.const 5) (local.get $kp) (local.get $kl) (i32.const 512) (i32.const 8))
                    (i32.const 8))
          (then (local.set $count (i64.load (i32.const 512)))))
        (local.set $count (i64.add (local.get $count) (i64.const 1)))
        (i64.store (i32.const 512) (local.get $count))
        (call $state_put (i32.const 16) (i32.const 5) (local.get $kp) (local.get $kl) (i32.const 512) (i32.const 8))
        (global.set $total (i64.add (global.get $total) (i64.const 1)))

        ;; emit(k, v ++ u8(input) ++ u64le(count), ts)
        (local.set $out (call $frame (local.get $ts) (local.get $kp) (local.get $kl) (i32.add (local.get $vl) (i32.const 9))))
        (memory.copy (local.get $out) (local.get $vp) (local.get $vl))
        (local.set $out (i32.add (local.get $out) (local.get $vl)))
        (i32.store8 (local.get $out) (local.get $input))
        (i64.store offset=1 (local.get $out) (local.get $count))
        (call $send)
        (br $next)))
    (i32.const 0))

  (func (export "streamd_on_timer") (param $ts i64) (param $kp i32) (param $kl i32) (result i32)
    (call $emit_const (local.get $ts) (local.get $kp) (local.get $kl) (i32.const 240) (i32.const 5))
    (i32.const 0))

  (func (export "streamd_on_watermark") (param $ts i64) (result i32)
    (call $emit_const (local.get $ts) (i32.const 0) (i32.const 0) (i32.const 272) (i32.const 2))
    (i32.const 0))

  (func (export "streamd_end_input") (param $input i32) (result i32)
    (local $out i32)
    (local.set $out (call $frame (i64.const 0x8000000000000000) (i32.const 0) (i32.const 0) (i32.const 4)))
    (memory.copy (local.get $out) (i32.const 288) (i32.const 3))
    (i32.store8 offset=3 (local.get $out) (local.get $input))
    (call $send)
    (i32.const 0))

  (func (export "streamd_finish") (result i32)
    (local $out i32)
    (local.set $out (call $frame (i64.const 0x8000000000000000) (i32.const 0) (i32.const 0) (i32.const 14)))
    (memory.copy (local.get $out) (i32.const 304) (i32.const 6))
    (i64.store offset=6 (local.get $out) (global.get $total))
    (call $send)
    (i32.const 0))

  (func (export "streamd_snapshot_state") (param $id i64) (result i32)
    (i64.store (i32.const 512) (global.get $total))
    (call $list_state_add (i32.const 32) (i32.const 5) (i32.const 0) (i32.const 512) (i32.const 8))
    (i64.store (i32.const 512) (local.get $id))
    (call $list_state_add (i32.const 48) (i32.const 4) (i32.const 1) (i32.const 512) (i32.const 8))
    (i32.const 0))

  (func (export "streamd_notify_checkpoint_complete") (param $id i64) (result i32)
    (call $log (i32.const 1) (i32.const 112) (i32.const 6))
    (i32.const 0))

  (func (export "streamd_close") (result i32)
    (call $log (i32.const 1) (i32.const 128) (i32.const 5))
    (i32.const 0))
)
