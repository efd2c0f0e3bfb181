//! Bundle loading: bytes of a bundle file, parsed and checked as `Bundle::load` does; and the
//! same bytes as the header of a bundle whose lengths and checksum are right, so that what
//! reads a header (loading, the session's checks before the GPU, saving) meets any JSON.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = fusec::Bundle::from_bytes(data, "fuzz.bundle");
    let weights = [1u8; 64];
    let mut bytes = Vec::with_capacity(data.len() + 100);
    bytes.extend_from_slice(fusec::bundle::MAGIC);
    bytes.extend_from_slice(&fusec::bundle::FORMAT_VERSION.to_le_bytes());
    bytes.extend_from_slice(&(data.len() as u64).to_le_bytes());
    bytes.extend_from_slice(data);
    bytes.extend_from_slice(&(weights.len() as u64).to_le_bytes());
    let sum = fusec::bundle::bundle_checksum(&bytes, &weights);
    bytes.extend_from_slice(&weights);
    bytes.extend_from_slice(&sum.to_le_bytes());
    if let Ok(bundle) = fusec::Bundle::from_bytes(&bytes, "fuzz.bundle") {
        // Without a driver (as where the fuzzer runs) the session stops after checking the
        // bundle's inputs and outputs against its memory.
        let _ = fusec::Session::new(&bundle, 0);
        let _ = bundle.to_bytes();
    }
});
