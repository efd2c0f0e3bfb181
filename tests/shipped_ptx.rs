//! The PTX kept beside the kernels the runtime loads as they are (`kernels/*.ptx`, built into
//! the binary) is what their sources compile to now: each is compiled again with NVRTC and the
//! options `kernels/README.md` gives, and must match byte for byte — so a change to a source
//! without its PTX regenerated fails here. Needs NVRTC 13.0 (the version the PTX was made
//! with); skipped, saying so, without it. `FUSEC_REGENERATE_PTX=1` writes the compiled PTX
//! over the kept files instead of comparing.

use std::path::Path;

/// Each kept PTX file, its source and the options it is compiled with.
const SHIPPED: [(&str, &str, &[&str]); 4] = [
    ("copy_rows.ptx", "copy_rows.cu", &["-arch=compute_75"]),
    ("argmax_rows.ptx", "argmax_rows.cu", &["-arch=compute_75"]),
    ("sample_rows.ptx", "sample_rows.cu", &["-arch=compute_75"]),
    ("sample_rows_cluster.ptx", "sample_rows.cu", &["-arch=compute_90", "-DSAMPLE_CLUSTER=8"]),
];

#[test]
fn the_kept_ptx_is_its_source_compiled() {
    match fusec::nvrtc::version() {
        Some((13, 0)) => {}
        Some((major, minor)) => {
            println!("skipped: NVRTC {major}.{minor}, the kept PTX was made with 13.0");
            return;
        }
        None => {
            println!("skipped: no NVRTC");
            return;
        }
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
    for (ptx, source, options) in SHIPPED {
        let source_text = std::fs::read_to_string(dir.join(source)).unwrap();
        let kept = std::fs::read_to_string(dir.join(ptx)).unwrap();
        let opts = cudarc::nvrtc::CompileOptions {
            options: options.iter().map(|o| o.to_string()).collect(),
            // `fusec.cuh`, which the sampling kernel includes for its cluster helpers.
            include_paths: vec![dir.display().to_string()],
            name: Some(source.to_string()),
            ..Default::default()
        };
        let compiled = cudarc::nvrtc::compile_ptx_with_opts(&source_text, opts)
            .unwrap_or_else(|e| panic!("{source} {options:?}: {e:?}"))
            .to_src();
        if std::env::var("FUSEC_REGENERATE_PTX").is_ok_and(|v| v.trim() == "1") {
            // After a change to a source: write what it compiles to (kernels/README.md).
            std::fs::write(dir.join(ptx), &compiled).unwrap();
            continue;
        }
        assert!(
            compiled == kept,
            "kernels/{ptx} is not what kernels/{source} compiles to with {options:?}: regenerate it \
             (kernels/README.md)"
        );
    }
}
