//! Given tokens scored (teacher forcing): each sequence's prompt and then a continuation fed one
//! token a step, whatever the logits would have chosen, and each step's logits asked what they
//! made of the token that follows: its logit, the row's best and the row's scale. Scoring a
//! GPU's greedy tokens this way on the CPU checks every one of them against the reference's
//! logits at the same prefix, so that a near tie which parts two free-running generations at
//! one token does not hide whether the tokens after it are right (`fusec generate --check`).

use super::sampling::greedy;
use super::{cache, step_mask, GenerateError, Generator, Steps};

/// What a step's logits made of the token given after it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scored {
    /// The token given.
    pub token: i64,
    /// Its logit.
    pub logit: f32,
    /// The row's largest logit (the first of equals) and its token.
    pub best: (i64, f32),
    /// The row's root mean square: the scale a near tie is measured on (a logit's rounding in
    /// a half-type build grows with it).
    pub rms: f32,
}

impl Scored {
    /// The scores of `token` in `row` (one step's logits of one sequence).
    pub fn of(row: &[f32], token: i64) -> Scored {
        let best = greedy(row);
        let squares: f64 = row.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        let rms = (squares / row.len().max(1) as f64).sqrt() as f32;
        Scored { token, logit: row[token as usize], best: (best as i64, row[best]), rms }
    }

    /// How far the token's logit lies below the row's best, in units of the row's root mean
    /// square (0 for the best, or a token that ties with it).
    pub fn gap(&self) -> f32 {
        if self.token == self.best.0 || self.logit >= self.best.1 {
            return 0.0;
        }
        (self.best.1 - self.logit) / self.rms.max(f32::MIN_POSITIVE)
    }

    /// Whether the token is the row's best.
    pub fn is_best(&self) -> bool {
        self.gap() == 0.0
    }
}

impl<S: Steps> Generator<S> {
    /// Feeds each prompt and then its continuation (`continuations[b]` after `prompts[b]`),
    /// one token a step through the one-token step, and scores every token of each
    /// continuation against the logits of the step before it ([`Scored`]). Sequences past
    /// their tokens run their last again, as padding, and are not scored.
    pub fn score(
        &mut self,
        prompts: &[Vec<i64>],
        continuations: &[Vec<i64>],
    ) -> Result<Vec<Vec<Scored>>, GenerateError> {
        let (batch, capacity, vocab) = (self.layout.batch, self.layout.capacity, self.layout.vocab);
        self.check_prompts(prompts)?;
        if continuations.len() != prompts.len() {
            return Err(GenerateError::Input(format!(
                "{} prompts and {} continuations: give one continuation a prompt",
                prompts.len(),
                continuations.len()
            )));
        }
        self.check_vocabulary(continuations)?;
        let sequences: Vec<Vec<i64>> =
            prompts.iter().zip(continuations).map(|(p, c)| [&p[..], c].concat()).collect();
        let longest = sequences.iter().map(Vec::len).max().unwrap_or(0);
        // A step a token but the last, as generating them took.
        if longest - 1 > capacity + 1 {
            return Err(GenerateError::Input(format!(
                "a prompt and continuation of {longest} tokens need {} positions; the bundle's cache holds {}",
                longest - 1,
                capacity + 1
            )));
        }
        for pair in &self.layout.pairs {
            self.steps.zero_input(&pair.past)?;
        }
        let mut scores = vec![Vec::new(); prompts.len()];
        let mut logits = Vec::with_capacity(batch * vocab);
        // The last token of the longest sequence is scored by the step before it; none follows it.
        for t in 0..longest.saturating_sub(1) {
            let tokens: Vec<f64> = (0..batch)
                .map(|b| {
                    let s = sequences.get(b).unwrap_or(&sequences[0]);
                    s[t.min(s.len() - 1)] as f64
                })
                .collect();
            self.write(cache::TOKENS, &[batch, 1], tokens)?;
            self.write(cache::POSITIONS, &[batch, 1], vec![t as f64; batch])?;
            self.write(cache::MASK, &[batch, capacity + 1], step_mask(batch, capacity, t))?;
            self.steps.execute()?;
            self.steps.read_output_f32(&self.layout.logits, &mut logits)?;
            for (b, s) in sequences.iter().enumerate() {
                if t + 1 >= prompts[b].len() && t + 1 < s.len() {
                    scores[b].push(Scored::of(&logits[b * vocab..(b + 1) * vocab], s[t + 1]));
                }
            }
            self.copy_cache(t, t + 2 < longest)?;
        }
        Ok(scores)
    }
}

#[cfg(test)]
mod tests {
    use super::Scored;

    #[test]
    fn the_best_token_has_no_gap_and_another_the_difference_over_the_rows_scale() {
        let row = [1.0_f32, 3.0, -2.0, 3.0, 0.5];
        let rms = ((1.0 + 9.0 + 4.0 + 9.0 + 0.25) / 5.0_f64).sqrt() as f32;
        let best = Scored::of(&row, 1);
        assert_eq!((best.best, best.gap(), best.is_best()), ((1, 3.0), 0.0, true));
        assert!((best.rms - rms).abs() < 1e-6);
        // A tie with the best (not the first of equals) is no gap either.
        assert!(Scored::of(&row, 3).is_best());
        let below = Scored::of(&row, 0);
        assert!(!below.is_best());
        assert!((below.gap() - 2.0 / rms).abs() < 1e-6, "{}", below.gap());
        assert_eq!(below.logit, 1.0);
    }
}
