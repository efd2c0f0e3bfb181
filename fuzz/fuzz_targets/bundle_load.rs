//! Bundle loading: bytes of a bundle file, parsed and checked as `Bundle::load` does.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = fusec::Bundle::from_bytes(data, "fuzz.bundle");
});
