#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| meridian_fuzz::request_body(data));
