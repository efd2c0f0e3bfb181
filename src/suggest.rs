//! "Did you mean …?" for names a user types: inputs, dimensions.

/// Edit distance (insertions, deletions, substitutions, and swaps of two neighbouring
/// characters, each counting 1) between `a` and `b`, by characters.
fn distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1).min(d[i][j - 1] + 1).min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}

/// `"; did you mean 'X'?"` for the candidate closest to `name` when it is close (at most a
/// third of the name's characters differ, at least 1 allowed, or they differ only in case),
/// else an empty string: to append to an error message.
pub fn did_you_mean<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> String {
    let limit = (name.chars().count() / 3).max(1);
    candidates
        .into_iter()
        .map(|c| (if c.eq_ignore_ascii_case(name) { 0 } else { distance(name, c) }, c))
        .filter(|&(d, _)| d <= limit)
        .min_by_key(|&(d, _)| d)
        .map(|(_, c)| format!("; did you mean '{c}'?"))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_names_are_suggested_and_far_ones_are_not() {
        assert_eq!(distance("kitten", "sitting"), 3);
        assert_eq!(distance("bacth", "batch"), 1);
        assert_eq!(did_you_mean("bacth", ["batch", "seq"]), "; did you mean 'batch'?");
        assert_eq!(did_you_mean("input_id", ["input_ids", "attention_mask"]), "; did you mean 'input_ids'?");
        assert_eq!(did_you_mean("SEQ", ["batch", "seq"]), "; did you mean 'seq'?");
        assert_eq!(did_you_mean("length", ["batch", "seq"]), "");
        assert_eq!(did_you_mean("x", std::iter::empty()), "");
    }
}
