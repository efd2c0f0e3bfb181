//! Lane loops: a thread of an elementwise kernel computing several consecutive elements of
//! the last axis, its reads and writes along that axis as packs (16-byte vector accesses).

use std::collections::BTreeMap;

use super::super::expr::{c_type, load};
use super::super::index::{Coords, Dims};
use super::Body;
use crate::ir::{DType, NodeId, SymDim};

/// The coordinate of an element along the last axis inside a thread's lane loop.
pub(in crate::codegen) const LANE: &str = "cj";

/// One vector load of a lane loop, declared before the loop: `const fusec::Pack<T, count> name =
/// value;`.
#[derive(Clone, Debug, PartialEq)]
pub(in crate::codegen) struct PackLoad {
    /// The element type in memory.
    pub dtype: DType,
    /// Elements in the pack.
    pub count: usize,
    /// The pack's variable.
    pub name: String,
    /// The expression loading it.
    pub value: String,
}

impl PackLoad {
    /// The pack's C type.
    pub(in crate::codegen) fn c_type(&self) -> String {
        format!("fusec::Pack<{}, {}>", c_type(self.dtype).unwrap_or("float"), self.count)
    }

    /// The statement declaring and loading it.
    pub(in crate::codegen) fn declaration(&self) -> String {
        format!("const {} {} = {};", self.c_type(), self.name, self.value)
    }

    /// The 32-bit registers it takes.
    pub(in crate::codegen) fn words(&self) -> usize {
        (self.dtype.size_bytes() * self.count).div_ceil(4)
    }
}

/// A thread's `count` consecutive elements along the last axis (of size `width`, a multiple
/// of `count`), starting at coordinate `base`. Reads and writes of a tensor whose last
/// coordinate is the lane's become one aligned load before the loop and one store after it.
pub(super) struct Lanes {
    pub(super) count: usize,
    width: SymDim,
    base: String,
    /// Vector loads and store registers, before the lane loop.
    pub(super) before: Vec<String>,
    /// Vector stores, after it.
    pub(super) after: Vec<String>,
    /// Loaded packs by address.
    loaded: BTreeMap<String, String>,
    /// The vector loads among `before`, in order.
    loads: Vec<PackLoad>,
    /// Columns (axis 2 of NHWC) the thread computes one after another from column `q0`, the
    /// lane loop repeated for each; `None`: one.
    tile: Option<usize>,
    /// Statements before the loop over a tile's columns.
    prologue: Vec<String>,
    /// A condition, the same for every lane, under which the reads being written are made (a
    /// concatenation's input, read only where the coordinate is in its part): the packs they
    /// load are loaded only where it holds, zeros elsewhere — never out of bounds.
    guard: Option<String>,
    /// Set under a condition that differs between lanes: reads are scalars, each in its branch.
    scalars: bool,
}

/// The first column of a thread's tile (see [`Body::begin_tile`]).
pub(in crate::codegen) const TILE_FIRST: &str = "q0";
/// A column's offset in its tile, inside the loop over the tile's columns.
pub(in crate::codegen) const TILE_OFFSET: &str = "tw";

/// `expr` without parentheses around the whole of it (`((cj))` is `cj`).
fn unwrapped(mut expr: &str) -> &str {
    while let Some(inner) = expr.strip_prefix('(').and_then(|e| e.strip_suffix(')')) {
        // Only where the first parenthesis closes at the end: not `(a) + (b)`.
        let mut depth = 0i32;
        let whole = inner.chars().all(|c| {
            depth += match c {
                '(' => 1,
                ')' => -1,
                _ => 0,
            };
            depth >= 0
        });
        if !whole {
            break;
        }
        expr = inner;
    }
    expr
}

/// Whether `expr` is the same for every lane: its only variables are coordinates `c<d>` and
/// the sizes of a program for ranges (`fusec_d<i>`).
fn lane_invariant(expr: &str) -> bool {
    let bytes = expr.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if c.is_ascii_alphanumeric() || c == b'_' {
            let start = i;
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
            let word = &expr[start..i];
            let number = c.is_ascii_digit();
            let digits_after = |prefix: &str| {
                word.len() > prefix.len()
                    && word.starts_with(prefix)
                    && word[prefix.len()..].bytes().all(|b| b.is_ascii_digit())
            };
            if !number && !digits_after("c") && !digits_after("fusec_d") {
                return false;
            }
        } else {
            i += 1;
        }
    }
    true
}

impl Body<'_> {
    /// Starts a lane loop of `count` consecutive elements of a last axis of size `width`,
    /// the first at coordinate `base`: reads and writes along it become packs.
    pub(in crate::codegen) fn begin_lanes(&mut self, count: usize, width: SymDim, base: &str) {
        self.lanes = Some(Lanes {
            count,
            width,
            base: base.into(),
            before: Vec::new(),
            after: Vec::new(),
            loaded: BTreeMap::new(),
            loads: Vec::new(),
            tile: None,
            prologue: Vec::new(),
            guard: None,
            scalars: false,
        });
    }

    /// Ends the lane loop: its pack loads and store registers (before the loop) and its pack
    /// stores (after it).
    pub(in crate::codegen) fn end_lanes(&mut self) -> (Vec<String>, Vec<String>) {
        let (before, after, _) = self.end_lanes_with_loads();
        (before, after)
    }

    /// [`Body::end_lanes`], and the vector loads among the statements before the loop.
    pub(in crate::codegen) fn end_lanes_with_loads(&mut self) -> (Vec<String>, Vec<String>, Vec<PackLoad>) {
        self.lanes.take().map(|l| (l.before, l.after, l.loads)).unwrap_or_default()
    }

    /// Makes each thread of the lane loop compute `count` columns (axis 2), from column
    /// [`TILE_FIRST`]: the loop is repeated for each with that axis' coordinate
    /// `TILE_FIRST + TILE_OFFSET`.
    pub(in crate::codegen) fn begin_tile(&mut self, count: usize) {
        if let Some(lanes) = self.lanes.as_mut() {
            lanes.tile = Some(count);
        }
    }

    /// The number of columns each thread computes, inside a tiled lane loop.
    pub(in crate::codegen) fn tile(&self) -> Option<usize> {
        self.lanes.as_ref().and_then(|l| l.tile)
    }

    /// A statement run once per thread before the loop over its tile's columns.
    pub(in crate::codegen) fn push_prologue(&mut self, statement: String) {
        if let Some(lanes) = self.lanes.as_mut() {
            lanes.prologue.push(statement);
        }
    }

    /// The statements before the loop over a tile's columns.
    pub(in crate::codegen) fn prologue(&self) -> Vec<String> {
        self.lanes.as_ref().map(|l| l.prologue.clone()).unwrap_or_default()
    }

    /// Runs `read` with the packs it loads guarded by `guard` (and by any guard already set),
    /// where `guard` is the same for every lane; a read of scalars needs none.
    pub(in crate::codegen) fn guarded<T>(
        &mut self,
        guard: Option<String>,
        read: impl FnOnce(&mut Self) -> Result<T, String>,
    ) -> Result<T, String> {
        let Some(lanes) = self.lanes.as_mut() else { return read(self) };
        let (outer, outer_scalars) = (lanes.guard.clone(), lanes.scalars);
        match guard {
            Some(g) if lane_invariant(&g) => {
                lanes.guard = Some(outer.as_ref().map_or_else(|| g.clone(), |o| format!("({o}) && ({g})")));
            }
            Some(_) => lanes.scalars = true,
            None => {}
        }
        let result = read(self);
        if let Some(lanes) = self.lanes.as_mut() {
            (lanes.guard, lanes.scalars) = (outer, outer_scalars);
        }
        result
    }

    /// The number of lanes, inside a lane loop.
    pub(in crate::codegen) fn lane_count(&self) -> Option<usize> {
        self.lanes.as_ref().map(|l| l.count)
    }

    /// A statement run once per thread before the lane loop (after the pack loads so far).
    pub(in crate::codegen) fn push_before_lanes(&mut self, statement: String) {
        if let Some(lanes) = self.lanes.as_mut() {
            lanes.before.push(statement);
        }
    }

    /// For a lane loop: the pointer, the first lane's index and the element type of the
    /// element of `id` at `coords` in memory, where the lanes read consecutive aligned
    /// elements there (a pack); `None` otherwise. The other coordinates may name variables
    /// of a loop the caller writes before the lane loop.
    pub(in crate::codegen) fn pack_address(
        &mut self,
        id: NodeId,
        coords: Coords,
    ) -> Result<Option<(String, String, DType)>, String> {
        let (source, coords) = self.stored_at(id, coords)?;
        let shape = self.plan.stored_dims(source);
        let Some(base) = self.first_lane(&coords, &shape, false) else { return Ok(None) };
        let dtype = self.plan.graph.node(source).ty.dtype;
        let pointer = self.pointer(source, false)?;
        Ok(Some((pointer, self.index_of(&base, &shape), dtype)))
    }

    /// For a lane loop: the first lane's coordinates of an access at `coords` in `shape`,
    /// when the lanes touch consecutive, aligned elements there.
    pub(super) fn lane_base(&self, coords: &[String], shape: &Dims) -> Option<Coords> {
        self.first_lane(coords, shape, true)
    }

    /// The first lane's coordinates where the last coordinate is the lane's along an axis of
    /// the lanes' width; with `invariant`, also only where the other coordinates are the same
    /// for every lane (a load hoisted before the lane loop can be written with them).
    fn first_lane(&self, coords: &[String], shape: &Dims, invariant: bool) -> Option<Coords> {
        let lanes = self.lanes.as_ref()?;
        let (last, rest) = coords.split_last()?;
        if unwrapped(last) != LANE
            || shape.last() != Some(&lanes.width)
            || (invariant && !rest.iter().all(|c| lane_invariant(c)))
        {
            return None;
        }
        let mut base = coords.to_vec();
        *base.last_mut()? = lanes.base.clone();
        Some(base)
    }

    /// The element at `coords` of a tensor of `shape` at `pointer`, widened to its register
    /// type; in a lane loop, from a vector load where the lanes read consecutive elements.
    pub(in crate::codegen) fn element(
        &mut self,
        pointer: &str,
        coords: &[String],
        shape: &Dims,
        dtype: DType,
    ) -> Result<String, String> {
        let base = self.lane_base(coords, shape).filter(|_| !self.lanes.as_ref().is_some_and(|l| l.scalars));
        let Some(base) = base else {
            return Ok(load(&format!("{pointer}[{}]", self.index_of(coords, shape)), dtype));
        };
        let ty = c_type(dtype)?;
        let address = format!("{pointer} + {}", self.index_of(&base, shape));
        let guard = self.lanes.as_ref().and_then(|l| l.guard.clone());
        let key = format!("{address} if {}", guard.as_deref().unwrap_or("true"));
        let loaded = self.lanes.as_ref().and_then(|l| l.loaded.get(&key).cloned());
        let pack = match loaded {
            Some(pack) => pack,
            None => {
                let pack = self.fresh("p");
                let lanes = self.lanes.as_mut().ok_or("no lanes")?;
                let n = lanes.count;
                let at = format!("reinterpret_cast<const fusec::Pack<{ty}, {n}>*>({address})");
                let value = match &guard {
                    Some(g) => format!("fusec::load_or_zero({at}, {g})"),
                    None => format!("*{at}"),
                };
                let load = PackLoad { dtype, count: n, name: pack.clone(), value };
                lanes.before.push(load.declaration());
                lanes.loads.push(load);
                lanes.loaded.insert(key, pack.clone());
                pack
            }
        };
        Ok(load(&format!("{pack}.v[j]"), dtype))
    }
}

#[cfg(test)]
mod tests {
    use super::unwrapped;

    #[test]
    fn only_parentheses_around_the_whole_are_taken_off() {
        assert_eq!(unwrapped("(cj)"), "cj");
        assert_eq!(unwrapped("((cj))"), "cj");
        assert_eq!(unwrapped("cj"), "cj");
        assert_eq!(unwrapped("(cj) + (c2)"), "(cj) + (c2)");
        assert_eq!(unwrapped("((cj) % 4)"), "(cj) % 4");
        assert_eq!(unwrapped("()"), "");
    }
}
