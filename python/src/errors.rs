//! fusec's errors as Python exceptions, each carrying fusec's message (the file, node, input
//! or kernel involved): `Error`, and below it `CompileError`, `BundleError`, `InputError`
//! (a feed that does not fit the model) and `DeviceError` (no GPU, a CUDA failure).

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

use fusec::runtime::RuntimeError;

create_exception!(fusec, Error, PyException, "Every error fusec raises.");
create_exception!(
    fusec,
    CompileError,
    Error,
    "A model that could not be compiled (the stage, node and file are named)."
);
create_exception!(fusec, BundleError, Error, "A bundle that could not be read or written.");
create_exception!(
    fusec,
    InputError,
    Error,
    "Inputs that do not fit the model (the input and what it takes are named)."
);
create_exception!(
    fusec,
    DeviceError,
    Error,
    "No GPU or driver, or a CUDA, cuBLAS or cuDNN call that failed."
);

/// Adds the exceptions to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("Error", py.get_type::<Error>())?;
    m.add("CompileError", py.get_type::<CompileError>())?;
    m.add("BundleError", py.get_type::<BundleError>())?;
    m.add("InputError", py.get_type::<InputError>())?;
    m.add("DeviceError", py.get_type::<DeviceError>())?;
    Ok(())
}

/// A runtime error as the exception for its kind.
pub fn runtime(e: RuntimeError) -> PyErr {
    match e {
        RuntimeError::Input(message) => InputError::new_err(message),
        // An index outside its table is the input's fault.
        e @ RuntimeError::IndexOutOfRange(_) => InputError::new_err(e.to_string()),
        other => DeviceError::new_err(other.to_string()),
    }
}

/// An error and its causes, one message (`anyhow`'s `{:#}` style, each cause said once:
/// [`fusec::error_chain::text`], as the command line prints them).
pub fn chain(e: &dyn std::error::Error) -> String {
    fusec::error_chain::text(e)
}
