//! An error and its causes as one line, the way the command line and the Python package report
//! them.

/// `e` and its causes joined by `: `, as anyhow's `{:#}` prints them, but for a cause whose
/// text the line already holds: an error that names its source in its own message and also
/// returns it as its source (`cannot read the file: No such file or directory`) would otherwise
/// print it twice.
pub fn text(e: &dyn std::error::Error) -> String {
    let mut line = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let part = cause.to_string();
        if !line.contains(&part) {
            line.push_str(": ");
            line.push_str(&part);
        }
        source = cause.source();
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    enum Outer {
        /// Names its source in its message and returns it as its source.
        #[error("{path}: cannot read the file: {source}")]
        Named { path: String, source: std::io::Error },
        /// Returns its source without naming it.
        #[error("{0}: cannot read the file")]
        Plain(String, #[source] std::io::Error),
    }

    #[test]
    fn a_cause_is_said_once() {
        let missing = || std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let named = Outer::Named { path: "a.onnx".into(), source: missing() };
        assert_eq!(text(&named), "a.onnx: cannot read the file: no such file");
        let plain = Outer::Plain("a.onnx".into(), missing());
        assert_eq!(text(&plain), "a.onnx: cannot read the file: no such file");
        let wrapped = anyhow::Error::new(plain).context("compiling a.onnx");
        assert_eq!(text(wrapped.as_ref()), "compiling a.onnx: a.onnx: cannot read the file: no such file");
    }
}
