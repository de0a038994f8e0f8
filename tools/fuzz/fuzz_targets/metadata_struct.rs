//! libFuzzer's shell for `sluice_fuzz_targets::metadata_struct`, which says what it asserts.

#![no_main]

libfuzzer_sys::fuzz_target!(|bytes: &[u8]| sluice_fuzz_targets::metadata_struct(bytes));
