;; The watermarks and side outputs guest, hand-written in WAT from abi/ABI.md
;; ("Watermarks and side outputs"); behaviour in guests/SPEC.md ("sideout").
(module
  (import "streamd_v1" "emit" (func $emit (param i32 i32)))
  (import "streamd_v1" "emit_to" (func $emit_to (param i32 i32 i32 i32)))
  (import "streamd_v1" "emit_watermark" (func $emit_watermark (param i64)))
  (import "streamd_v1" "input_watermark" (func $input_watermark (param i32) (result i64)))

  (memory (export "memory") 1)

  (data (i32.const 16) "side")
  (data (i32.const 32) "wm")
  (data (i32.const 48) "iw")
  (data (i32.const 64) "badin")
  (data (i32.const 80) "badname")
  (data (i32.const 96) "bad name")
  (data (i32.const 112) "wmfinish")

  (global $heap (mut i32) (i32.const 1024))
  (global $scratch (mut i32) (i32.const 0))
  (global $scratch_cap (mut i32) (i32.const 0))
  (global $frame_len (mut i32) (i32.const 0))
  (global $wm_in_finish (mut i32) (i32.const 0))

  (func (export "streamd_abi_version") (result i32) (i32.const 1))

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

  ;; $frame: a one-record batch frame (ts, key, vlen value bytes) in the
  ;; scratch buffer; returns where the value goes.
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

  ;; (k, v, ts) as a frame in the scratch buffer
  (func $copy_frame (param $ts i64) (param $kp i32) (param $kl i32) (param $vp i32) (param $vl i32)
    (memory.copy (call $frame (local.get $ts) (local.get $kp) (local.get $kl) (local.get $vl)) (local.get $vp) (local.get $vl)))

  (func (export "streamd_open") (param $ctx i32) (param $len i32) (result i32)
    (i32.const 0))

  (func (export "streamd_process") (param $input i32) (param $ptr i32) (param $len i32) (result i32)
    (local $n i32) (local $p i32) (local $ts i64) (local $kp i32) (local $kl i32) (local $vp i32) (local $vl i32)
    (local $out i32) (local $last i32)
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

        ;; "wm": emit_watermark(ts)
        (if (call $eq (local.get $vp) (local.get $vl) (i32.const 32) (i32.const 2))
          (then (call $emit_watermark (local.get $ts)) (br $next)))
        ;; "iw": emit(k, "iw" ++ i64le(input_watermark(0)) ++ i64le(input_watermark(1)), ts)
        (if (call $eq (local.get $vp) (local.get $vl) (i32.const 48) (i32.const 2))
          (then
            (local.set $out (call $frame (local.get $ts) (local.get $kp) (local.get $kl) (i32.const 18)))
            (i32.store16 (local.get $out) (i32.load16_u (i32.const 48)))
            (i64.store offset=2 (local.get $out) (call $input_watermark (i32.const 0)))
            (i64.store offset=10 (local.get $out) (call $input_watermark (i32.const 1)))
            (call $emit (global.get $scratch) (global.get $frame_len))
            (br $next)))
        ;; "badin": input_watermark(7) fails the subtask
        (if (call $eq (local.get $vp) (local.get $vl) (i32.const 64) (i32.const 5))
          (then (drop (call $input_watermark (i32.const 7))) (br $next)))
        ;; "badname": emit_to("bad name", ...) fails the subtask
        (if (call $eq (local.get $vp) (local.get $vl) (i32.const 80) (i32.const 7))
          (then
            (call $copy_frame (local.get $ts) (local.get $kp) (local.get $kl) (local.get $vp) (local.get $vl))
            (call $emit_to (i32.const 96) (i32.const 8) (global.get $scratch) (global.get $frame_len))
            (br $next)))
        ;; "wmfinish": finish will call emit_watermark (not allowed there)
        (if (call $eq (local.get $vp) (local.get $vl) (i32.const 112) (i32.const 8))
          (then (global.set $wm_in_finish (i32.const 1)) (br $next)))

        (call $copy_frame (local.get $ts) (local.get $kp) (local.get $kl) (local.get $vp) (local.get $vl))
        ;; a value ending in an odd digit goes to the side output "side"
        (local.set $last (i32.const 0))
        (if (local.get $vl)
          (then (local.set $last (i32.load8_u (i32.sub (i32.add (local.get $vp) (local.get $vl)) (i32.const 1))))))
        (if (i32.and
              (i32.and (i32.ge_u (local.get $last) (i32.const 0x30)) (i32.le_u (local.get $last) (i32.const 0x39)))
              (i32.and (local.get $last) (i32.const 1)))
          (then (call $emit_to (i32.const 16) (i32.const 4) (global.get $scratch) (global.get $frame_len)))
          (else (call $emit (global.get $scratch) (global.get $frame_len))))
        (br $next)))
    (i32.const 0))

  ;; on_watermark(ts): its own output watermark is ts - 1000 (none for MAX:
  ;; the host sends MAX after finish).
  (func (export "streamd_on_watermark") (param $ts i64) (result i32)
    (if (i64.ne (local.get $ts) (i64.const 0x7fffffffffffffff))
      (then (call $emit_watermark (i64.sub (local.get $ts) (i64.const 1000)))))
    (i32.const 0))

  (func (export "streamd_finish") (result i32)
    (if (global.get $wm_in_finish) (then (call $emit_watermark (i64.const 0))))
    (i32.const 0))

  (func (export "streamd_close") (result i32) (i32.const 0))
)
