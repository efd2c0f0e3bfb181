//! Constants derived from other constants, made once for every graph planned from one model.
//!
//! The planner for ranges plans the same model at several sizes. Each size's graph holds the
//! same initializers (one `Arc` each), but a pass that derives a constant from them — the
//! precision pass converting a weight to f16, [`super::MergeSiblingMatMuls`] concatenating the
//! Q, K and V weights — would make a copy per size: four sizes of BERT-base held four merged
//! projections and their conversions. Through [`SharedConstants`] a derivation from the same
//! values is made and held once, and every size's graph holds the one result.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::ir::{DType, Tensor};

/// Derived constants shared by the graphs planned with it, keyed by what was done and the
/// source values (held, so that their addresses are not reused while the key stands).
#[derive(Default)]
pub struct SharedConstants(Mutex<HashMap<Key, Arc<Derived>>>);

/// What was done and the addresses of the values it was done to.
type Key = (String, Vec<usize>);

/// The source values (held) and the result, once made.
struct Derived {
    _sources: Vec<Arc<Tensor>>,
    /// Locked while it is made: a second graph wanting it waits rather than making a copy.
    value: Mutex<Option<Arc<Tensor>>>,
}

impl SharedConstants {
    /// The result of `make` on `sources`, made once per `what` and sources (a graph that
    /// wants it while another makes it waits for that one).
    pub fn derive<E>(
        &self,
        what: &str,
        sources: &[&Arc<Tensor>],
        make: impl FnOnce() -> Result<Tensor, E>,
    ) -> Result<Arc<Tensor>, E> {
        let key = (what.to_string(), sources.iter().map(|s| Arc::as_ptr(s) as usize).collect());
        let entry = {
            let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            let held = || Derived {
                _sources: sources.iter().map(|&s| s.clone()).collect(),
                value: Mutex::new(None),
            };
            map.entry(key).or_insert_with(|| Arc::new(held())).clone()
        };
        let mut value = entry.value.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(done) = value.as_ref() {
            return Ok(done.clone());
        }
        let done = Arc::new(make()?);
        *value = Some(done.clone());
        Ok(done)
    }

    /// `value` in `dtype`, converted once.
    pub fn cast(&self, value: &Arc<Tensor>, dtype: DType) -> Arc<Tensor> {
        let converted: Result<_, std::convert::Infallible> =
            self.derive(&format!("cast {dtype}"), &[value], || Ok(value.cast(dtype)));
        match converted {
            Ok(v) => v,
            Err(never) => match never {},
        }
    }

    /// `value` in `dtype`, through `shared` where given, else converted here.
    pub fn cast_through(shared: Option<&Self>, value: &Arc<Tensor>, dtype: DType) -> Arc<Tensor> {
        match shared {
            Some(shared) => shared.cast(value, dtype),
            None => Arc::new(value.cast(dtype)),
        }
    }

    /// `make` through `shared` where given, else made here.
    pub fn derive_or_make<E>(
        shared: Option<&Self>,
        what: &str,
        sources: &[&Arc<Tensor>],
        make: impl FnOnce() -> Result<Tensor, E>,
    ) -> Result<Arc<Tensor>, E> {
        match shared {
            Some(shared) => shared.derive(what, sources, make),
            None => make().map(Arc::new),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_derivation_from_the_same_values_is_made_once() {
        let shared = SharedConstants::default();
        let value = || Arc::new(Tensor::F32(ndarray::arr1(&[1.0f32, 2.0]).into_dyn()));
        let (a, b) = (value(), value());
        let mut made = 0;
        let mut derive = |x: &Arc<Tensor>| {
            shared
                .derive::<String>("double", &[x], || {
                    made += 1;
                    Ok(Tensor::F32(ndarray::arr1(&[2.0f32, 4.0]).into_dyn()))
                })
                .unwrap()
        };
        let first = derive(&a);
        let again = derive(&a);
        assert!(Arc::ptr_eq(&first, &again));
        // Another value with the same contents is another source.
        let other = derive(&b);
        assert!(!Arc::ptr_eq(&first, &other));
        assert_eq!(made, 2);
        let half = shared.cast(&a, DType::F16);
        assert!(Arc::ptr_eq(&half, &shared.cast(&a, DType::F16)));
        assert_eq!(half.dtype(), DType::F16);
    }
}
