//! Environment variables read at compile time that set what code generation and the passes
//! choose (`FUSEC_SKINNY_WARPS`, `FUSEC_ATTENTION_CLUSTER`, `FUSEC_WEIGHTS_BY_ROWS`, …): each
//! exists to measure a choice against its alternatives (`docs/knobs.md`).

/// The whole number environment variable `name` holds, if it holds one (surrounding blanks
/// allowed).
pub(crate) fn number(name: &str) -> Option<usize> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// [`number`] where it is one of `allowed`.
pub(crate) fn one_of(name: &str, allowed: &[usize]) -> Option<usize> {
    number(name).filter(|v| allowed.contains(v))
}

/// Whether environment variable `name` is `0`: a knob turning something off.
pub(crate) fn off(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v.trim() == "0")
}

/// Whether environment variable `name` is `1`: a knob turning something on.
pub(crate) fn on(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v.trim() == "1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knobs_read_numbers_and_zeros() {
        let name = "FUSEC_KNOBS_UNIT_TEST";
        std::env::set_var(name, " 4 ");
        assert_eq!(number(name), Some(4));
        assert_eq!(one_of(name, &[1, 2, 4]), Some(4));
        assert_eq!(one_of(name, &[1, 2]), None);
        assert!(!off(name) && !on(name));
        std::env::set_var(name, "0");
        assert!(off(name) && !on(name));
        std::env::set_var(name, "1 ");
        assert!(on(name) && !off(name));
        std::env::set_var(name, "many");
        assert_eq!(number(name), None);
        std::env::remove_var(name);
        assert_eq!(number(name), None);
        assert!(!off(name) && !on(name));
    }
}
