//! An error and its causes as one line, the way the command line and the Python package report
//! them.

/// `e` and its causes joined by `: `, as anyhow's `{:#}` prints them, but for a cause whose
/// text ends the message of the error it is the source of: an error that names its source in its
/// own message and also returns it as its source (`cannot read the file: No such file or
/// directory`) would otherwise print it twice. A cause whose text merely occurs somewhere in the
/// line (`1` in `layer 1`) is kept.
pub fn text(e: &dyn std::error::Error) -> String {
    let mut line = e.to_string();
    let mut parent = line.clone();
    let mut source = e.source();
    while let Some(cause) = source {
        let part = cause.to_string();
        if !parent.ends_with(&part) {
            line.push_str(": ");
            line.push_str(&part);
        }
        parent = part;
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

    #[test]
    fn a_cause_found_elsewhere_in_the_line_is_kept() {
        let short = || std::io::Error::other("1");
        let plain = Outer::Plain("layer 1".into(), short());
        assert_eq!(text(&plain), "layer 1: cannot read the file: 1");
        let named = Outer::Named { path: "layer 1".into(), source: short() };
        assert_eq!(text(&named), "layer 1: cannot read the file: 1");
    }
}
