//! The key/value cache of a decoder exported with it (`past_key_values.{i}.key|value` in,
//! `present.{i}.key|value` out, the layout Hugging Face Optimum and ONNX Runtime GenAI use),
//! held at a fixed capacity: a bundle compiled for one decoding step (`seq` = 1) with `past`
//! set to the capacity reads every cached slot, the attention mask telling filled slots from
//! empty ones; after each step the new token's keys and values (the last position of each
//! `present`) are copied on the device into the slot of its position.

use crate::bundle::IoSpec;
use crate::ir::DType;
use crate::runtime::{CacheCopy, ColumnSet, RowCopy};

/// The token ids a decoder with a cache takes, `[batch, seq]`.
pub const TOKENS: &str = "input_ids";
/// Which positions (cached, then the step's own) each sequence reads, `[batch, past + seq]`.
pub const MASK: &str = "attention_mask";
/// Each token's position, `[batch, seq]`.
pub const POSITIONS: &str = "position_ids";

/// One cached tensor: the input it is read from and the output the step's extension goes to.
#[derive(Clone, Debug, PartialEq)]
pub struct CachePair {
    /// The input (`past_key_values.0.key`).
    pub past: String,
    /// The output (`present.0.key`).
    pub present: String,
    /// `[batch, heads, capacity, head_dim]`.
    pub shape: [usize; 4],
    /// Bytes an element (the cache's type: f32, or the storage type of a cache updated in
    /// place).
    pub element_bytes: usize,
    /// Positions from one row of the input's buffer to the next: the capacity, or for an input
    /// stored inside its output (a cache updated in place) the output's `capacity + seq`.
    pub slots: usize,
}

/// A step's cache copy as one copy ([`CacheLayout::one_copy`]): the (output, input) pairs,
/// the rows copied, and the next step's position and mask slot set with it.
pub struct OneCopy<'a> {
    pairs: Vec<(&'a str, &'a str)>,
    copy: RowCopy,
    sets: Vec<ColumnSet<'static>>,
}

impl OneCopy<'_> {
    /// The copy as the steps take it.
    pub fn as_copy(&self) -> CacheCopy<'_> {
        CacheCopy { pairs: &self.pairs, copy: self.copy, sets: &self.sets }
    }
}

/// A decoder's inputs and outputs read as a step with a cache.
#[derive(Clone, Debug, PartialEq)]
pub struct CacheLayout {
    /// Sequences a step runs.
    pub batch: usize,
    /// Cached positions: the most tokens (prompt and generated) a sequence can hold.
    pub capacity: usize,
    /// Tokens a sequence the step takes (1 for the one-token step; a prompt step's length).
    pub seq: usize,
    /// Logits a token.
    pub vocab: usize,
    /// The logits output.
    pub logits: String,
    /// Every cached tensor.
    pub pairs: Vec<CachePair>,
}

/// The prefixes of a cache's inputs (`past_key_values.0.key`) and of its outputs
/// (`present.0.key`).
const PAST: [&str; 2] = ["past_key_values", "past"];
const PRESENT: [&str; 1] = ["present"];

/// What a cached tensor's name says after its prefix: `0.key` for `past_key_values.0.key`
/// and `present.0.key`.
fn suffix<'a>(name: &'a str, prefixes: &[&str]) -> Option<&'a str> {
    prefixes.iter().find_map(|p| name.strip_prefix(p)).map(|s| s.trim_start_matches('.'))
}

/// Whether a model's inputs and outputs hold a key/value cache: an input
/// `past_key_values.{key}` (or `past.{key}`) beside an output `present.{key}`.
pub fn has_cache(inputs: &[IoSpec], outputs: &[IoSpec]) -> bool {
    inputs
        .iter()
        .filter_map(|s| suffix(&s.name, &PAST))
        .any(|key| outputs.iter().any(|o| suffix(&o.name, &PRESENT) == Some(key)))
}

impl CacheLayout {
    /// The layout of a bundle's inputs and outputs, or why they are not a decoding step with
    /// a cache (naming the input or output that is not).
    pub fn of(inputs: &[IoSpec], outputs: &[IoSpec]) -> Result<CacheLayout, String> {
        Self::read(inputs, outputs, true)
    }

    /// The layout of a prompt step's bundle: [`CacheLayout::of`] for `seq` tokens a sequence
    /// (`seq` of the layout), after a cache of the same capacity as the one-token step's.
    pub fn of_prompt(inputs: &[IoSpec], outputs: &[IoSpec]) -> Result<CacheLayout, String> {
        Self::read(inputs, outputs, false)
    }

    fn read(inputs: &[IoSpec], outputs: &[IoSpec], one_token: bool) -> Result<CacheLayout, String> {
        let input = |name: &str| {
            inputs.iter().find(|s| s.name == name).ok_or_else(|| {
                format!(
                    "a decoder with a cache takes '{TOKENS}', '{MASK}' and '{POSITIONS}'; this one has no '{name}' \
                     (its inputs: {})",
                    inputs.iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(", ")
                )
            })
        };
        let tokens = input(TOKENS)?;
        let (mask, positions) = (input(MASK)?, input(POSITIONS)?);
        if inputs.iter().any(|s| s.dims.is_some()) {
            return Err(
                "the bundle is compiled for ranges of sizes, and a generator runs a step compiled for one \
                 batch and one cache capacity (give the ONNX file, or compile with --dim batch=B --dim seq=1 \
                 --dim past=P --dim total=past+seq)"
                    .to_string(),
            );
        }
        let [batch, seq] = tokens.shape[..] else {
            return Err(format!("'{TOKENS}' is {:?}, not [batch, seq]", tokens.shape));
        };
        if one_token && seq != 1 {
            return Err(format!(
                "'{TOKENS}' is {:?}: a decoding step takes one token a sequence (compile with --dim seq=1)",
                tokens.shape
            ));
        }
        if positions.shape != tokens.shape {
            return Err(format!("'{POSITIONS}' is {:?}, '{TOKENS}' {:?}", positions.shape, tokens.shape));
        }
        let mut pairs = Vec::new();
        let mut capacity = None;
        for (spec, key) in inputs.iter().filter_map(|s| Some((s, suffix(&s.name, &PAST)?))) {
            let present = outputs
                .iter()
                .find(|o| suffix(&o.name, &PRESENT) == Some(key))
                .ok_or_else(|| format!("cache input '{}' has no output 'present.{key}'", spec.name))?;
            let [b, heads, past, dim] = spec.shape[..] else {
                return Err(format!(
                    "cache input '{}' is {:?}, not [batch, heads, past, head_dim]",
                    spec.name, spec.shape
                ));
            };
            let dtype = DType::from_name(&spec.dtype).filter(|d| d.is_float() && spec.dtype == present.dtype);
            let Some(dtype) = dtype.filter(|_| b == batch && present.shape == [b, heads, past + seq, dim])
            else {
                return Err(format!(
                    "cache input '{}' is {}{:?} and output '{}' {}{:?}: expected [{batch}, heads, past, head_dim] \
                     and [{batch}, heads, past + {seq}, head_dim] of one floating-point type",
                    spec.name, spec.dtype, spec.shape, present.name, present.dtype, present.shape
                ));
            };
            let slots = match &spec.inside {
                Some(inside) if inside.output == present.name => past + seq,
                Some(inside) => {
                    return Err(format!(
                        "cache input '{}' is stored inside output '{}', not '{}'",
                        spec.name, inside.output, present.name
                    ))
                }
                None => past,
            };
            if *capacity.get_or_insert(past) != past {
                return Err(format!(
                    "cache input '{}' holds {past} positions, the others {capacity:?}",
                    spec.name
                ));
            }
            pairs.push(CachePair {
                past: spec.name.clone(),
                present: present.name.clone(),
                shape: [b, heads, past, dim],
                element_bytes: dtype.size_bytes(),
                slots,
            });
        }
        let capacity = capacity.ok_or("the model has no cache inputs (past_key_values.{i}.key|value)")?;
        if mask.shape != [batch, capacity + seq] {
            return Err(format!(
                "'{MASK}' is {:?}, expected [{batch}, past + seq] = [{batch}, {}]",
                mask.shape,
                capacity + seq
            ));
        }
        let logits = outputs.first().ok_or("the model has no outputs")?;
        let vocab = match logits.shape[..] {
            [b, s, v] if b == batch && s == seq => v,
            _ => {
                return Err(format!(
                    "the first output '{}' is {:?}, not logits [batch, seq, vocab]",
                    logits.name, logits.shape
                ))
            }
        };
        Ok(CacheLayout { batch, capacity, seq, vocab, logits: logits.name.clone(), pairs })
    }

    /// The copy of a prompt step's keys or values (the last `seq` positions of `present` of
    /// `pair`, this layout's) into the first `seq` cache slots of `into`, the one-token
    /// step's input of the same pair.
    pub fn fill(&self, pair: &CachePair, into: &CachePair) -> RowCopy {
        let [b, heads, past, dim] = pair.shape;
        let row = dim * pair.element_bytes;
        RowCopy {
            rows: b * heads,
            width: self.seq * row,
            from_offset: past * row,
            from_pitch: (past + self.seq) * row,
            to_offset: 0,
            to_pitch: into.slots * row,
        }
    }

    /// After step `t` (before the capacity), the copy of every cached tensor's new rows into
    /// slot `t` as one copy, where they share a geometry: the (output, input) pairs, the
    /// copy, and where a step follows (`next`) the sets of its position and its mask slot.
    pub fn one_copy(&self, t: usize, next: bool) -> Option<OneCopy<'_>> {
        let first = self.pairs.first()?;
        if t >= self.capacity || self.pairs.iter().any(|p| self.append(p, t) != self.append(first, t)) {
            return None;
        }
        let pairs = self.pairs.iter().map(|p| (p.present.as_str(), p.past.as_str())).collect();
        let sets = match next {
            true => vec![
                ColumnSet { input: POSITIONS, column: 0, value: (t + 1) as f64 },
                ColumnSet { input: MASK, column: t, value: 1.0 },
            ],
            false => vec![],
        };
        Some(OneCopy { pairs, copy: self.append(first, t), sets })
    }

    /// The copy of a step's new keys or values (the last position of `present`) into cache
    /// slot `slot` of `pair`'s input.
    pub fn append(&self, pair: &CachePair, slot: usize) -> RowCopy {
        let [b, heads, past, dim] = pair.shape;
        let row = dim * pair.element_bytes;
        RowCopy {
            rows: b * heads,
            width: row,
            from_offset: past * row,
            from_pitch: (past + 1) * row,
            to_offset: slot * row,
            to_pitch: pair.slots * row,
        }
    }
}
