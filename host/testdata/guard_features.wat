;; Not a guest: a module using what the guard's rewriter must renumber or
;; decode (imports, start, ref.func in globals and element segments of every
;; encoding, tables, call_indirect, multi-value loops, br_table, bulk memory,
;; SIMD, non-trapping conversions). guard_test.go runs its exports with and
;; without the guard and compares the results.
(module
  (type $v (func))
  (type $ii (func (param i32) (result i32)))
  (import "env" "ext" (func $ext (param i32) (result i32)))
  (memory (export "memory") 1)
  (table $t 8 funcref)
  (table $t2 4 funcref)
  (global $started (mut i32) (i32.const 0))
  (global $fref funcref (ref.func $double))
  (data $d "hello, guard")

  (elem (i32.const 0) $double $triple)                        ;; flags 0
  (elem $passive func $triple $double)                        ;; flags 1
  (elem (table $t2) (i32.const 0) func $triple)               ;; flags 2
  (elem declare func $loopy)                                  ;; flags 3
  (elem (i32.const 2) funcref (ref.func $inc) (ref.null func)) ;; flags 4
  (elem $pexpr funcref (ref.func $inc) (ref.null func))      ;; flags 5
  (elem (table $t2) (i32.const 1) funcref (ref.func $double) (ref.null func)) ;; flags 6
  (elem declare funcref (ref.func $triple) (ref.null func)) ;; flags 7

  (start $start)
  (func $start (global.set $started (i32.const 7)))
  (func $double (type $ii) (i32.mul (local.get 0) (i32.const 2)))
  (func $triple (type $ii) (i32.mul (local.get 0) (i32.const 3)))
  (func $inc (type $ii) (i32.add (local.get 0) (i32.const 1)))

  ;; sum of f(i) for i in [0, n) over a multi-value loop, f from the table
  (func $loopy (export "loopy") (param $n i32) (param $slot i32) (result i32)
    (local $i i32) (local $acc i32)
    (i32.const 0) (i32.const 0)
    (loop $l (param i32 i32) (result i32 i32)
      (local.set $acc)
      (local.set $i)
      (local.set $acc (i32.add (local.get $acc) (call_indirect (type $ii) (local.get $i) (local.get $slot))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (local.get $i) (local.get $acc)
      (br_if $l (i32.lt_u (local.get $i) (local.get $n))))
    (local.set $acc) (drop)
    (local.get $acc))

  (func (export "started") (result i32) (global.get $started))
  (func (export "via_global") (param i32) (result i32)
    (table.set $t (i32.const 5) (global.get $fref))
    (call_indirect (type $ii) (local.get 0) (i32.const 5)))
  (func (export "via_t2") (param i32) (param i32) (result i32)
    (call_indirect $t2 (type $ii) (local.get 0) (local.get 1)))
  (func (export "passive") (param i32) (result i32)
    (table.init $t $pexpr (i32.const 6) (i32.const 0) (i32.const 2))
    (table.init $t $passive (i32.const 3) (i32.const 0) (i32.const 1))
    (i32.add (call_indirect (type $ii) (local.get 0) (i32.const 6))
             (call_indirect (type $ii) (local.get 0) (i32.const 3))))
  (func (export "ext") (param i32) (result i32) (call $ext (local.get 0)))
  (func (export "reffunc") (result i32)
    (ref.is_null (ref.func $triple)))

  ;; branches out of nested loops and blocks, br_table
  (func (export "branchy") (param $n i32) (result i32)
    (local $i i32) (local $r i32)
    (block $out
      (loop $outer
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (block $b2
          (block $b1
            (block $b0
              (br_table $b0 $b1 $b2 (i32.rem_u (local.get $i) (i32.const 3))))
            (local.set $r (i32.add (local.get $r) (i32.const 1)))
            (br $b2))
          (local.set $r (i32.add (local.get $r) (i32.const 10))))
        (loop $inner
          (if (i32.gt_u (local.get $i) (local.get $n)) (then (br $out)))
          (br_if $inner (i32.ne (i32.and (local.get $r) (i32.const 0x8000_0000)) (i32.const 0))))
        (br $outer)))
    (local.get $r))

  ;; bulk memory, SIMD, saturating conversion, sign extension
  (func (export "mixed") (param $n i32) (result i32)
    (local $v v128) (local $i i32)
    (memory.init $d (i32.const 100) (i32.const 0) (i32.const 12))
    (memory.copy (i32.const 200) (i32.const 100) (i32.const 12))
    (memory.fill (i32.const 300) (i32.const 7) (i32.const 16))
    (data.drop $d)
    (local.set $v (v128.const i32x4 1 2 3 4))
    (loop $l
      (local.set $v (i32x4.add (local.get $v) (v128.load (i32.const 300))))
      (local.set $v (i8x16.shuffle 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 (local.get $v) (local.get $v)))
      (v128.store offset=400 (i32.const 0) (local.get $v))
      (local.set $v (v128.load32_lane 1 (i32.const 300) (local.get $v)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (local.get $n))))
    (i32.add
      (i32.add (i32x4.extract_lane 2 (local.get $v)) (i32.load8_u (i32.const 204)))
      (i32.add (i32.trunc_sat_f32_s (f32.const 1e10)) (i32.extend8_s (i32.const 0xff)))))

  ;; a loop long enough to yield several times
  (func (export "count") (param $n i32) (result i32)
    (local $i i32)
    (loop $l
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (local.get $n))))
    (local.get $i))
)
