;; ABI v1 guest whose streamd_process never returns: a loop with no exit
;; (the guard must stop it), and whose streamd_finish loops "long" (a
;; counted loop of the i32 in memory at 0, then returns 0).
(module
  (memory (export "memory") 1)
  (func (export "streamd_abi_version") (result i32) (i32.const 1))
  (func (export "streamd_alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "streamd_open") (param i32 i32) (result i32) (i32.const 0))
  (func (export "streamd_process") (param i32 i32 i32) (result i32)
    (loop $spin (br $spin))
    (i32.const 0))
  (func (export "streamd_finish") (result i32)
    (local $n i32)
    (local.set $n (i32.load (i32.const 0)))
    (block $done
      (loop $count
        (br_if $done (i32.eqz (local.get $n)))
        (local.set $n (i32.sub (local.get $n) (i32.const 1)))
        (br $count)))
    (i32.const 0))
  (func (export "streamd_close") (result i32) (i32.const 0))
)
