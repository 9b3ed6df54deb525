;; ABI v1 guest whose streamd_process logs "spinning" (so a test knows it
;; got there) and then never returns: a loop with no exit, which the guard
;; must make interruptible.
(module
  (import "streamd_v1" "log" (func $log (param i32 i32 i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "spinning")
  (func (export "streamd_abi_version") (result i32) (i32.const 1))
  (func (export "streamd_alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "streamd_open") (param i32 i32) (result i32) (i32.const 0))
  (func (export "streamd_process") (param i32 i32 i32) (result i32)
    (call $log (i32.const 2) (i32.const 16) (i32.const 8))
    (loop $spin (br $spin))
    (i32.const 0))
  (func (export "streamd_close") (result i32) (i32.const 0))
)
