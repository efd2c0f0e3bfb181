//! The steps of a decoding loop on the GPU: a [`Session`] as [`Steps`] — tokens chosen, drawn
//! and fed back on the device, inputs set a column at a time, the cache copied by a kernel.

use super::{GenerateError, Steps};
use crate::ir::{DType, Tensor};
use crate::runtime::{CacheCopy, RowCopy, RowDraw, SampledRows, Session};

impl Steps for Session {
    fn write_input(&mut self, name: &str, tensor: &Tensor) -> Result<(), GenerateError> {
        Ok(Session::write_input(self, name, tensor)?)
    }
    fn set_input_column(&mut self, name: &str, column: usize, value: f64) -> Result<bool, GenerateError> {
        Session::set_input_column(self, name, column, value)?;
        Ok(true)
    }
    fn zero_input(&mut self, name: &str) -> Result<(), GenerateError> {
        Ok(Session::zero_input(self, name)?)
    }
    fn execute(&mut self) -> Result<(), GenerateError> {
        Ok(self.execute_all()?)
    }
    fn execute_queued(&mut self) -> Result<(), GenerateError> {
        Ok(Session::execute_queued(self)?)
    }
    fn read_output(&mut self, name: &str) -> Result<Tensor, GenerateError> {
        Ok(Session::read_output(self, name)?)
    }
    fn read_output_f32(&mut self, name: &str, out: &mut Vec<f32>) -> Result<(), GenerateError> {
        Ok(Session::read_output_f32(self, name, out)?)
    }
    fn argmax_rows(
        &mut self,
        name: &str,
        rows: usize,
        width: usize,
    ) -> Result<Option<Vec<i64>>, GenerateError> {
        Ok(Some(Session::argmax_rows(self, name, rows, width)?))
    }
    fn sample_rows(
        &mut self,
        name: &str,
        at: SampledRows,
        draw: RowDraw,
        temperature: f64,
        draws: &[f64],
    ) -> Result<Option<Vec<i64>>, GenerateError> {
        if sample_on_host() {
            return Ok(None);
        }
        Ok(Some(Session::sample_rows(self, name, at, draw, temperature, draws)?))
    }
    fn argmax_feed(
        &mut self,
        logits: &str,
        rows: usize,
        width: usize,
        tokens: &str,
    ) -> Result<bool, GenerateError> {
        if !feeds(self, tokens) {
            return Ok(false);
        }
        Session::argmax_feed(self, logits, rows, width, tokens)?;
        Ok(true)
    }
    fn sample_feed(
        &mut self,
        logits: &str,
        at: SampledRows,
        (draw, temperature): (RowDraw, f64),
        draws: &[f64],
        tokens: &str,
    ) -> Result<bool, GenerateError> {
        if !feeds(self, tokens) || sample_on_host() {
            return Ok(false);
        }
        Session::sample_feed(self, logits, at, draw, temperature, draws, tokens)?;
        Ok(true)
    }
    fn argmax_feed_copying(
        &mut self,
        logits: &str,
        (rows, width): (usize, usize),
        tokens: &str,
        cache: CacheCopy<'_>,
    ) -> Result<Option<bool>, GenerateError> {
        if !feeds(self, tokens) {
            return Ok(None);
        }
        if crate::knobs::off("FUSEC_GENERATE_ONE_LAUNCH") {
            Session::argmax_feed(self, logits, rows, width, tokens)?;
            Session::copy_output_rows_setting(self, cache)?;
        } else {
            Session::argmax_feed_copying(self, logits, (rows, width), tokens, cache)?;
        }
        Ok(Some(true))
    }
    fn sample_feed_copying(
        &mut self,
        logits: &str,
        (at, (draw, temperature)): (SampledRows, (RowDraw, f64)),
        draws: &[f64],
        tokens: &str,
        cache: CacheCopy<'_>,
    ) -> Result<Option<bool>, GenerateError> {
        if !feeds(self, tokens) || sample_on_host() {
            return Ok(None);
        }
        if crate::knobs::off("FUSEC_GENERATE_ONE_LAUNCH") {
            Session::sample_feed(self, logits, at, draw, temperature, draws, tokens)?;
            Session::copy_output_rows_setting(self, cache)?;
        } else {
            Session::sample_feed_copying(self, logits, at, (draw, temperature), draws, tokens, cache)?;
        }
        Ok(Some(true))
    }
    fn fed_tokens(&mut self) -> Result<Vec<i64>, GenerateError> {
        Ok(Session::fed_tokens(self)?)
    }
    fn copy_output_rows(&mut self, from: &str, to: &str, copy: RowCopy) -> Result<(), GenerateError> {
        Ok(Session::copy_output_rows(self, from, to, copy)?)
    }
    fn copy_output_rows_many(&mut self, pairs: &[(&str, &str)], copy: RowCopy) -> Result<(), GenerateError> {
        Ok(Session::copy_output_rows_many(self, pairs, copy)?)
    }
    fn copy_output_rows_setting(&mut self, cache: CacheCopy<'_>) -> Result<bool, GenerateError> {
        Session::copy_output_rows_setting(self, cache)?;
        Ok(true)
    }
    fn copy_output_rows_into(
        &mut self,
        target: &mut Self,
        pairs: &[(&str, &str)],
        copy: RowCopy,
    ) -> Result<(), GenerateError> {
        Ok(Session::copy_output_rows_into(self, target, pairs, copy)?)
    }
    fn input_type(&self, name: &str) -> Option<DType> {
        self.inputs().iter().find(|s| s.name == name).and_then(|s| DType::from_name(&s.dtype))
    }
    fn timing_event(&mut self) -> Result<Option<crate::runtime::TimingEvent>, GenerateError> {
        Ok(Some(self.record_timing_event()?))
    }
}

/// `FUSEC_SAMPLE_ON_HOST=1`: the logits come back and the host draws (for comparison).
fn sample_on_host() -> bool {
    static ON_HOST: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON_HOST.get_or_init(|| std::env::var("FUSEC_SAMPLE_ON_HOST").is_ok_and(|v| v.trim() == "1"))
}

/// Whether `session` feeds ids back into its input `tokens` (an i64 input), unless
/// `FUSEC_FEED_TOKENS=0` (every step's ids back on the host before the next step is queued,
/// for comparison).
fn feeds(session: &Session, tokens: &str) -> bool {
    static OFF: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let off = *OFF.get_or_init(|| std::env::var("FUSEC_FEED_TOKENS").is_ok_and(|v| v.trim() == "0"));
    !off && session.input_type(tokens) == Some(DType::I64)
}
