;; Bad module: the optional export streamd_on_watermark takes an i32 instead of an i64.
(module
  (memory (export "memory") 1)
  (func (export "streamd_abi_version") (result i32) (i32.const 1))
  (func (export "streamd_alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "streamd_open") (param i32 i32) (result i32) (i32.const 0))
  (func (export "streamd_process") (param i32 i32 i32) (result i32) (i32.const 0))
  (func (export "streamd_on_watermark") (param i32) (result i32) (i32.const 0))
  (func (export "streamd_close") (result i32) (i32.const 0))
)
