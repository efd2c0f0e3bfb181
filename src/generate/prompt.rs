//! The prompt in one step: the decoder compiled a second time for `P` tokens a sequence (its
//! cache inputs of any capacity, every slot masked: `fusec generate` compiles it after a
//! cache of one position, so that its attention reads the prompt alone), run once on
//! the first `P` tokens of every prompt; its keys and values go into the first `P` slots of
//! the one-token step's cache (one copy on the device), and a sequence whose prompt is `P`
//! tokens long takes its first token from that step's last logits. The rest of a longer
//! prompt goes token by token, as without a prompt step. No padding: `P` is at most the
//! shortest prompt (a prompt step longer than that is not used).

use super::cache;
use super::{
    draws_for, logits_of, pick, record, write_input, Bundle, CacheLayout, GenerateError, GenerateOptions,
    Generation, Generator, Sampler, Session, Steps,
};
use crate::runtime::{RowCopy, SampledRows};

impl Generator<Session> {
    /// Loads the one-token `step` bundle and the `prompt` bundle (the same decoder compiled
    /// with `seq` = P and the same batch and cache) on GPU `device`, both warmed up.
    pub fn with_prompt(step: &Bundle, prompt: &Bundle, device: usize) -> Result<Generator, GenerateError> {
        let layout = CacheLayout::of_prompt(&prompt.header.inputs, &prompt.header.outputs)
            .map_err(GenerateError::Layout)?;
        let mut prompt = Session::new(prompt, device)?;
        prompt.warm_up()?;
        Generator::new(step, device)?.with_prompt_steps(prompt, layout)
    }
}

impl<S: Steps> Generator<S> {
    /// Adds a prompt step run by `steps`, of `layout` (batch, vocabulary and cached tensors
    /// those of the one-token step; its cache of any capacity, its slots masked out, and its
    /// prompt no longer than the one-token step's cache).
    pub fn with_prompt_steps(mut self, steps: S, layout: CacheLayout) -> Result<Self, GenerateError> {
        let step = &self.layout;
        // The same tensors but for the positions cached: batch, heads, head size, type.
        let same_pairs = layout.pairs.len() == step.pairs.len()
            && layout.pairs.iter().all(|p| {
                step.pairs.iter().any(|s| {
                    let ([b, h, _, d], [sb, sh, _, sd]) = (p.shape, s.shape);
                    s.past == p.past && (b, h, d) == (sb, sh, sd) && s.element_bytes == p.element_bytes
                })
            });
        if layout.batch != step.batch
            || layout.seq > step.capacity
            || layout.vocab != step.vocab
            || !same_pairs
        {
            return Err(GenerateError::Layout(format!(
                "the prompt step (batch {}, {} tokens, vocabulary {}) does not match the one-token step (batch {}, \
                 cache {}, vocabulary {}) or its cached tensors",
                layout.batch, layout.seq, layout.vocab, step.batch, step.capacity, step.vocab
            )));
        }
        self.prompt = Some((steps, layout));
        Ok(self)
    }

    /// Tokens a sequence the prompt step takes (none without one).
    pub fn prompt_length(&self) -> Option<usize> {
        self.prompt.as_ref().map(|(_, layout)| layout.seq)
    }

    /// Runs the prompt step where there is one that fits every prompt: fills the cache's
    /// first `P` slots, chooses the first token of each sequence whose prompt is `P` long.
    /// Returns the position the token-by-token steps start at (0 when it did not run).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run_prompt(
        &mut self,
        rows: &[&Vec<i64>],
        prompts: &[Vec<i64>],
        options: &GenerateOptions,
        sampler: &mut Sampler,
        out: &mut Generation,
        done: &mut [bool],
        on_token: &mut impl FnMut(usize, i64),
    ) -> Result<usize, GenerateError> {
        let Generator { steps: step, prompt, layout: step_layout } = self;
        let Some((steps, layout)) = prompt.as_mut() else { return Ok(0) };
        let p = layout.seq;
        let shortest = prompts.iter().map(Vec::len).min().unwrap_or(0);
        if p > shortest || p < 2 {
            return Ok(0);
        }
        let (batch, capacity, vocab) = (layout.batch, layout.capacity, layout.vocab);
        for pair in &layout.pairs {
            steps.zero_input(&pair.past)?;
        }
        let tokens = rows.iter().flat_map(|r| r[..p].iter().map(|&t| t as f64)).collect();
        write_input(steps, cache::TOKENS, &[batch, p], tokens)?;
        let positions = (0..batch).flat_map(|_| (0..p).map(|j| j as f64)).collect();
        write_input(steps, cache::POSITIONS, &[batch, p], positions)?;
        let mask =
            (0..batch).flat_map(|_| (0..capacity + p).map(|j| f64::from(u8::from(j >= capacity)))).collect();
        write_input(steps, cache::MASK, &[batch, capacity + p], mask)?;
        steps.execute()?;
        let pairs: Vec<(&str, &str)> =
            layout.pairs.iter().map(|q| (q.present.as_str(), q.past.as_str())).collect();
        // Each pair's copy, into the one-token step's input of the same name.
        let copies: Vec<RowCopy> = layout
            .pairs
            .iter()
            .map(|q| step_layout.pairs.iter().find(|s| s.past == q.past).map(|into| layout.fill(q, into)))
            .collect::<Option<_>>()
            .ok_or_else(|| {
                GenerateError::Layout("the prompt step's cache is not the one-token step's".into())
            })?;
        match copies.first().filter(|f| copies.iter().all(|c| c == *f)) {
            Some(&copy) => steps.copy_output_rows_into(step, &pairs, copy)?,
            None => {
                for (pair, &copy) in pairs.iter().zip(&copies) {
                    steps.copy_output_rows_into(step, &[*pair], copy)?;
                }
            }
        }
        // The first tokens of the sequences whose prompt ends here, from the last position's
        // logits (greedy on the GPU where the steps can: only ids come back).
        if prompts.iter().any(|q| q.len() == p) {
            let mut logits = Vec::new();
            // Each sequence's last position: row b·p + p − 1.
            let picks: Vec<bool> =
                (0..batch).map(|b| prompts.get(b).is_some_and(|q| q.len() == p) && !done[b]).collect();
            let draws = draws_for(sampler, &picks);
            let at = SampledRows { rows: batch, width: vocab, step: p, offset: p - 1 };
            let chosen = logits_of(steps, &layout.logits, at, sampler, &draws, &mut logits)?;
            for b in (0..prompts.len()).filter(|&b| picks[b]) {
                let token = pick(&chosen, &logits, sampler, at, b, &draws);
                record(&mut out.tokens, done, b, token, options, on_token);
            }
        }
        out.steps += 1;
        Ok(p)
    }
}
