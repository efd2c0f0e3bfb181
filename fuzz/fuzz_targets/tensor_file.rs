//! Input files: bytes of a `.npy` file and of an ONNX TensorProto (`.pb`), read as
//! `fusec run --input` and `fusec run DIR` read them.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let dir = std::env::temp_dir().join(format!("fusec-fuzz-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    for name in ["input.npy", "input.pb"] {
        let path = dir.join(name);
        if std::fs::write(&path, data).is_ok() {
            let _ = fusec::tensor_io::read_tensor(&path);
        }
    }
});
