;; Bad module: imports streamd_v1.emit_watermark with a wrong signature
;; (i32 instead of i64).
(module
  (import "streamd_v1" "emit_watermark" (func (param i32)))
  (memory (export "memory") 1)
  (func (export "streamd_abi_version") (result i32) (i32.const 1))
  (func (export "streamd_alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "streamd_open") (param i32 i32) (result i32) (i32.const 0))
  (func (export "streamd_process") (param i32 i32 i32) (result i32) (i32.const 0))
  (func (export "streamd_close") (result i32) (i32.const 0))
)
