//! Choosing the next token from a row of logits: greedy, or drawn at a temperature from the
//! top k tokens or the smallest set whose probability reaches p.

use std::fmt;
use std::str::FromStr;

use crate::ir::SplitMix64;

/// How the next token is chosen.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Sampling {
    /// The most likely token (the lowest id among equals).
    Greedy,
    /// Drawn from the `k` most likely tokens.
    TopK(usize),
    /// Drawn from the most likely tokens whose probabilities add up to at least `p` (nucleus).
    TopP(f64),
}

impl FromStr for Sampling {
    type Err = String;

    /// `greedy`, `top-k=K` (K ≥ 1) or `top-p=P` (0 < P ≤ 1).
    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text == "greedy" {
            return Ok(Sampling::Greedy);
        }
        if let Some(k) = text.strip_prefix("top-k=") {
            return match k.parse::<usize>() {
                Ok(k) if k >= 1 => Ok(Sampling::TopK(k)),
                _ => Err(format!("'{text}': top-k needs a whole number of tokens, at least 1")),
            };
        }
        if let Some(p) = text.strip_prefix("top-p=") {
            return match p.parse::<f64>() {
                Ok(p) if p > 0.0 && p <= 1.0 => Ok(Sampling::TopP(p)),
                _ => Err(format!("'{text}': top-p needs a probability in (0, 1]")),
            };
        }
        Err(format!("'{text}' is not a sampling: give greedy, top-k=K or top-p=P"))
    }
}

impl fmt::Display for Sampling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Sampling::Greedy => write!(f, "greedy"),
            Sampling::TopK(k) => write!(f, "top-k={k}"),
            Sampling::TopP(p) => write!(f, "top-p={p}"),
        }
    }
}

/// Chooses tokens from logits: `sampling` at `temperature`, draws from a generator seeded
/// with `seed` (the same tokens for the same seed).
pub struct Sampler {
    sampling: Sampling,
    temperature: f64,
    rng: SplitMix64,
}

impl Sampler {
    /// A sampler; `temperature` must be positive (it is not used by greedy choice).
    pub fn new(sampling: Sampling, temperature: f64, seed: u64) -> Result<Self, String> {
        if !(temperature > 0.0 && temperature.is_finite()) {
            return Err(format!("temperature {temperature}: it must be a positive number"));
        }
        Ok(Sampler { sampling, temperature, rng: SplitMix64(seed) })
    }

    /// The token chosen from one row of logits (one per vocabulary entry): greedy, or drawn
    /// ([`Sampler::draw`], then [`Sampler::choose_with`]).
    pub fn choose(&mut self, logits: &[f32]) -> usize {
        match self.sampling {
            Sampling::Greedy => greedy(logits),
            _ => {
                let u = self.draw();
                self.choose_with(logits, u)
            }
        }
    }

    /// The next draw in [0, 1): one per token a drawing sampler chooses.
    pub fn draw(&mut self) -> f64 {
        self.rng.unit()
    }

    /// What the GPU is to draw from, and at which temperature: `None` for greedy choice,
    /// which takes no draw.
    pub fn row_draw(&self) -> Option<(crate::runtime::RowDraw, f64)> {
        match self.sampling {
            Sampling::Greedy => None,
            Sampling::TopK(k) => Some((crate::runtime::RowDraw::TopK(k), self.temperature)),
            Sampling::TopP(p) => Some((crate::runtime::RowDraw::TopP(p), self.temperature)),
        }
    }

    /// The token drawn from one row of logits with draw `u` in [0, 1): tokens ordered by
    /// logit (highest first, ties by id, NaNs left out), weighted exp((logit − top) /
    /// temperature); the first k of them, or the shortest run whose weights reach p of the
    /// total; the first kept token whose running weight passes `u` times the kept weight.
    /// Greedy choice ignores `u`. `kernels/sample_rows.cu` makes the same choice on the GPU.
    pub fn choose_with(&self, logits: &[f32], u: f64) -> usize {
        let keep = match self.sampling {
            Sampling::Greedy => return greedy(logits),
            Sampling::TopK(k) => Keep::Count(k),
            Sampling::TopP(p) => Keep::Mass(p),
        };
        // Most likely first; ties by id.
        let mut order: Vec<usize> = (0..logits.len()).filter(|&i| !logits[i].is_nan()).collect();
        if order.is_empty() {
            return 0;
        }
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        let top = f64::from(logits[order[0]]);
        let weights: Vec<f64> =
            order.iter().map(|&i| ((f64::from(logits[i]) - top) / self.temperature).exp()).collect();
        let total: f64 = weights.iter().sum();
        let kept = match keep {
            Keep::Count(k) => k.min(order.len()),
            Keep::Mass(p) => {
                let mut mass = 0.0;
                weights
                    .iter()
                    .position(|w| {
                        mass += w / total;
                        mass >= p
                    })
                    .map_or(order.len(), |i| i + 1)
            }
        };
        let sum: f64 = weights[..kept].iter().sum();
        let mut u = u * sum;
        for (k, w) in weights[..kept].iter().enumerate() {
            if u < *w {
                return order[k];
            }
            u -= w;
        }
        order[kept - 1]
    }
}

/// The largest value's index (the first of equals; NaNs never win; 0 where none is above
/// -inf).
pub(super) fn greedy(logits: &[f32]) -> usize {
    let (mut best, mut top) = (0, f32::NEG_INFINITY);
    for (i, &v) in logits.iter().enumerate() {
        if v > top {
            (best, top) = (i, v);
        }
    }
    best
}

enum Keep {
    Count(usize),
    Mass(f64),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samplings_parse_and_print() {
        for text in ["greedy", "top-k=40", "top-p=0.9"] {
            assert_eq!(text.parse::<Sampling>().unwrap().to_string(), text);
        }
        for bad in ["top-k=0", "top-p=1.5", "top-p=0", "beam=4", "top-k=x"] {
            assert!(bad.parse::<Sampling>().is_err(), "{bad}");
        }
        assert!(Sampler::new(Sampling::Greedy, 0.0, 1).is_err());
    }

    #[test]
    fn edge_cases_draw_what_they_can() {
        // k over the vocabulary keeps all of it; p = 1 keeps every token with any weight.
        let logits = [1.0f32, 0.5, 0.25];
        let mut wide = Sampler::new(Sampling::TopK(10), 1.0, 1).unwrap();
        let drawn: Vec<usize> = (0..300).map(|_| wide.choose(&logits)).collect();
        assert!((0..3).all(|t| drawn.contains(&t)), "{drawn:?}");
        let mut all = Sampler::new(Sampling::TopP(1.0), 1.0, 2).unwrap();
        let drawn: Vec<usize> = (0..300).map(|_| all.choose(&logits)).collect();
        assert!((0..3).all(|t| drawn.contains(&t)), "{drawn:?}");
        // k = 1 and a tiny p are greedy.
        for sampling in [Sampling::TopK(1), Sampling::TopP(1e-9)] {
            let mut one = Sampler::new(sampling, 1.0, 3).unwrap();
            assert!((0..50).all(|_| one.choose(&[0.3, 2.0, 1.9]) == 1), "{sampling}");
        }
        // NaNs are never drawn; a row of them gives token 0; -inf has no weight.
        let mut s = Sampler::new(Sampling::TopK(3), 1.0, 4).unwrap();
        let with_nan = [f32::NAN, 0.0, f32::NEG_INFINITY, 0.1];
        let drawn: Vec<usize> = (0..200).map(|_| s.choose(&with_nan)).collect();
        assert!(drawn.iter().all(|&t| t == 1 || t == 3), "{drawn:?}");
        assert_eq!(s.choose(&[f32::NAN, f32::NAN]), 0);
        let mut greedy = Sampler::new(Sampling::Greedy, 1.0, 0).unwrap();
        assert_eq!(greedy.choose(&[f32::NAN, f32::NAN]), 0);
        assert_eq!(greedy.choose(&[f32::NEG_INFINITY, f32::NEG_INFINITY]), 0);
        assert_eq!(greedy.choose(&[f32::NAN, -1.0, f32::NAN, 3.0]), 3);
        // Different seeds draw differently.
        let mut a = Sampler::new(Sampling::TopP(0.99), 1.0, 5).unwrap();
        let mut b = Sampler::new(Sampling::TopP(0.99), 1.0, 6).unwrap();
        let flat = [0.0f32; 16];
        let (x, y): (Vec<usize>, Vec<usize>) = (0..40).map(|_| (a.choose(&flat), b.choose(&flat))).unzip();
        assert_ne!(x, y);
    }

    #[test]
    fn greedy_takes_the_largest_and_the_first_of_equals() {
        let mut s = Sampler::new(Sampling::Greedy, 1.0, 1).unwrap();
        assert_eq!(s.choose(&[0.5, 2.0, -1.0, 2.0]), 1);
        assert_eq!(s.choose(&[-3.0, -2.5, -7.0]), 1);
    }

    #[test]
    fn top_k_and_top_p_draw_only_from_what_they_keep() {
        let logits = [0.1f32, 3.0, 2.9, -5.0, 2.8, 0.0];
        let mut top2 = Sampler::new(Sampling::TopK(2), 1.0, 7).unwrap();
        let drawn: Vec<usize> = (0..400).map(|_| top2.choose(&logits)).collect();
        assert!(drawn.iter().all(|&t| t == 1 || t == 2), "{drawn:?}");
        assert!(drawn.contains(&1) && drawn.contains(&2));
        // Tokens 1, 2, 4 hold ~0.96 of the mass (1 and 2 ~0.67): p = 0.9 keeps those three.
        let mut nucleus = Sampler::new(Sampling::TopP(0.9), 1.0, 9).unwrap();
        let drawn: Vec<usize> = (0..600).map(|_| nucleus.choose(&logits)).collect();
        assert!(drawn.iter().all(|&t| [1, 2, 4].contains(&t)), "{drawn:?}");
        assert!([1, 2, 4].iter().all(|t| drawn.contains(t)));
        // A low temperature makes the top token near certain; the same seed draws the same.
        let mut cold = Sampler::new(Sampling::TopK(3), 0.01, 3).unwrap();
        assert!((0..100).all(|_| cold.choose(&logits) == 1));
        let mut a = Sampler::new(Sampling::TopP(0.99), 1.0, 5).unwrap();
        let mut b = Sampler::new(Sampling::TopP(0.99), 1.0, 5).unwrap();
        assert!((0..50).all(|_| a.choose(&logits) == b.choose(&logits)));
    }
}
