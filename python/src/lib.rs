//! fusec's Python module, `fusec._fusec`: the library the CLI uses, for the Python layer in
//! `python/fusec/` to wrap. Each concept has a room: errors as Python exceptions (`errors`),
//! compiling and bundles (`bundle`), sessions (`session`), generating tokens (`generate`),
//! host arrays read through the buffer protocol (`buffer`), host outputs handed to NumPy
//! through it (`output`) and device tensors handed out as
//! DLPack capsules (`dlpack`).

// Input- and device-dependent paths return errors: no unwrap or expect.
#![deny(clippy::unwrap_used, clippy::expect_used)]

mod buffer;
mod bundle;
mod dlpack;
mod errors;
mod generate;
mod output;
mod session;

use pyo3::prelude::*;

#[pymodule]
fn _fusec(m: &Bound<'_, PyModule>) -> PyResult<()> {
    errors::register(m)?;
    m.add_class::<bundle::PyBundle>()?;
    m.add_class::<session::PySession>()?;
    m.add_class::<generate::PyGenerator>()?;
    m.add_class::<generate::PyGeneration>()?;
    m.add_class::<output::HostOutput>()?;
    m.add_function(wrap_pyfunction!(bundle::compile, m)?)?;
    m.add_function(wrap_pyfunction!(bundle::summarize, m)?)?;
    m.add_function(wrap_pyfunction!(bundle::fixed_output_dims, m)?)?;
    m.add_function(wrap_pyfunction!(session::cuda_available, m)?)?;
    m.add_function(wrap_pyfunction!(session::nvrtc_available, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
