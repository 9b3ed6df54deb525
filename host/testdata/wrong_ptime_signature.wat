;; Exports streamd_on_processing_time with an i32 timestamp: refused at load.
(module
  (memory (export "memory") 1)
  (func (export "streamd_abi_version") (result i32) (i32.const 1))
  (func (export "streamd_alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "streamd_open") (param i32 i32) (result i32) (i32.const 0))
  (func (export "streamd_process") (param i32 i32 i32) (result i32) (i32.const 0))
  (func (export "streamd_on_processing_time") (param i32 i32 i32) (result i32) (i32.const 0))
  (func (export "streamd_close") (result i32) (i32.const 0)))
