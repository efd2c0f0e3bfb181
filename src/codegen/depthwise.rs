//! Depthwise convolutions with large windows in NHWC (ConvNeXt's 7×7, EfficientNet's and
//! MobileNet's 5×5) over a multiple of 32 channels: each block stages its input tile and its channels' filters in shared
//! memory as f32, once; each thread then computes a pair of channels over a row of output
//! columns from shared memory and registers, and runs the kernel's other nodes (bias,
//! activation, …) as its epilogue. Smaller windows keep the generated loop
//! (`Body::depthwise_packs`), which measured as fast on 3×3 (`benches/NOTES.md`).

use handlebars::Handlebars;
use serde_json::json;

use super::expr::{c_type, load};
use super::index::{Coords, Dims};
use super::kernel::{args, params, render, Body, LANE, TILE_FIRST, TILE_OFFSET};
use super::KernelSource;
use crate::fusion::{Kernel, KernelKind};
use crate::ir::{Op, SymDim};
use crate::passes::Depthwise;
use crate::plan::Plan;

/// Windows of fewer taps stay with the generated loop.
const MIN_TAPS: usize = 25;
/// Shared memory a block stages (a static allocation may take 48 KiB).
const SHARED_BYTES: usize = 40 * 1024;
/// Channels a thread computes: one pair, read from shared memory as a `float2`.
const PAIR: usize = 2;
/// The coordinate of a thread's first channel (its lanes are `PAIR` channels from it).
const CHANNEL_BASE: &str = "c3";

/// A block's share of the output: `channels` channels of `rows` rows of `columns` columns,
/// each thread a channel pair over one row's columns; the input it reads is `in_rows` ×
/// `in_columns`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Tile {
    channels: usize,
    rows: usize,
    columns: usize,
    in_rows: usize,
    in_columns: usize,
}

impl Tile {
    fn threads(&self) -> usize {
        self.channels / PAIR * self.rows
    }
}

/// The tile of a kernel that is a depthwise convolution in NHWC (one filter per channel) with
/// at least [`MIN_TAPS`] taps, a multiple of 32 channels, static shapes (in a program for one
/// size), and every node of the output's shape; `None` for any other kernel.
pub(super) fn tile(plan: &Plan, kernel: &Kernel, shape: &Dims) -> Option<Tile> {
    // A program for ranges of sizes launches every kernel scaled to the point it runs at; the
    // tile kernel's grid is for one size.
    if Depthwise::from_env() != Depthwise::Tile || plan.scaled() {
        return None;
    }
    let graph = &plan.graph;
    let conv = *kernel.nodes.first()?;
    let Op::Conv { strides, dilations, channels_last: true, .. } = graph.node(conv).op else {
        return None;
    };
    let dims: Vec<usize> = shape.iter().map(SymDim::value).collect::<Option<_>>()?;
    let inputs = graph.inputs_of(conv);
    let w = &graph.node(inputs[1]).ty.shape;
    let x = plan.dims(inputs[0]);
    let same = kernel.nodes.iter().all(|&n| plan.dims(n) == *shape);
    if kernel.kind != KernelKind::Conv
        || !graph.is_depthwise_conv(conv)
        || dims.len() != 4
        || dims.contains(&0)
        || w.len() != 4
        || w[0] != dims[3]
        || w[3] != 1
        || w[1] * w[2] < MIN_TAPS
        || x.len() != 4
        || x[3] != SymDim::lit(dims[3])
        || !x.iter().all(SymDim::is_static)
        || !same
    {
        return None;
    }
    // 32 channels a block (16 pairs): narrower blocks measured slower than the loop
    // (MobileNetV3's 72 and 120 channels, EfficientNet's 144; `benches/NOTES.md`).
    if dims[3] % 32 != 0 {
        return None;
    }
    let mut channels = 32;
    // Rows and columns per block: the largest of 8..4 that divides the size (no idle
    // threads), else 8.
    let fit = |n: usize| (4..=8).rev().find(|k| n % k == 0).unwrap_or(8).min(n);
    let (mut rows, columns) = (fit(dims[1]), fit(dims[2]));
    let span =
        |n: usize, stride: usize, dilation: usize, taps: usize| (n - 1) * stride + (taps - 1) * dilation + 1;
    loop {
        let in_rows = span(rows, strides[0], dilations[0], w[1]);
        let in_columns = span(columns, strides[1], dilations[1], w[2]);
        if 4 * channels * (in_rows * in_columns + w[1] * w[2]) <= SHARED_BYTES {
            return Some(Tile { channels, rows, columns, in_rows, in_columns });
        }
        if channels > 8 {
            channels /= 2;
        } else if rows > 1 {
            rows -= 1;
        } else {
            return None;
        }
    }
}

/// The kernel of `tile`; `None` where the input's channels are not read as 16-byte packs.
pub(super) fn generate(
    plan: &Plan,
    kernel: &Kernel,
    name: &str,
    hb: &Handlebars<'_>,
    tile: Tile,
) -> Result<Option<KernelSource>, String> {
    let graph = &plan.graph;
    let conv = *kernel.nodes.first().ok_or("an empty kernel")?;
    let last = *kernel.nodes.last().ok_or("an empty kernel")?;
    let mut body = Body::new(plan, kernel);
    if !body.packs_along(graph.inputs_of(conv)[0], 3, 8) {
        return Ok(None);
    }
    let shape = plan.dims(last);
    let dims = plan.sizes(last).ok_or("a dynamic shape")?;
    let coords: Coords = vec!["c0".into(), "c1".into(), "c2".into(), LANE.into()];
    body.begin_lanes(PAIR, shape[3].clone(), CHANNEL_BASE);
    body.begin_tile(tile.columns);
    body.shared_depthwise = Some(tile);
    let computed: Vec<_> = kernel.nodes.iter().copied().filter(|&n| body.computes(n)).collect();
    for n in computed {
        body.compute(n, &coords)?;
    }
    for &o in &kernel.outputs {
        body.store(kernel, o, &coords)?;
    }
    let prologue = body.prologue();
    let (before, after) = body.end_lanes();
    let blocks =
        dims[0] * dims[1].div_ceil(tile.rows) * dims[2].div_ceil(tile.columns) * (dims[3] / tile.channels);
    let data = json!({
        "name": name,
        "headers": body.headers.iter().collect::<Vec<_>>(),
        "about": kernel.kind.name(),
        "threads": tile.threads(),
        "params": params(&body),
        "prologue": prologue,
        "columns": tile.columns,
        "width": dims[2],
        "tile_offset": TILE_OFFSET,
        "tile_first": TILE_FIRST,
        "lanes": PAIR,
        "lane": LANE,
        "base": CHANNEL_BASE,
        "before": before,
        "statements": body.statements,
        "after": after,
    });
    Ok(Some(KernelSource::new(
        name,
        render(hb, "depthwise", &data)?,
        u32::try_from(blocks).map_err(|_| "too many blocks")?,
        tile.threads() as u32,
        args(&body),
    )))
}

impl Body<'_> {
    /// The value of depthwise convolution `id` inside a [`Tile`]'s kernel: the block's input
    /// tile and filters staged in shared memory, then the thread's accumulators (all in the
    /// prologue); each lane's value is its accumulator plus the bias.
    pub(super) fn shared_depthwise_value(
        &mut self,
        id: crate::ir::NodeId,
        strides: [usize; 2],
        pads: [usize; 4],
        dilations: [usize; 2],
        tile: Tile,
    ) -> Result<String, String> {
        let graph = &self.plan.graph;
        let inputs = graph.inputs_of(id).to_vec();
        let x_dims = self.dims(inputs[0]);
        let w = graph.node(inputs[1]).ty.shape.clone();
        let out = self.dims(id);
        let size = |d: &SymDim| d.value().ok_or("a dynamic shape");
        let (height, width) = (size(&x_dims[1])?, size(&x_dims[2])?);
        let (rows_out, columns_out) = (size(&out[1])?, size(&out[2])?);
        let Tile { channels, rows, columns, in_rows, in_columns } = tile;
        let threads = tile.threads();
        let packs = channels / 8;
        let (row_tiles, column_tiles) = (rows_out.div_ceil(rows), columns_out.div_ceil(columns));
        let channel_tiles = size(&out[3])? / channels;
        let (x_at, x_type) =
            self.address(inputs[0], vec!["c0".into(), "dw_ih".into(), "dw_iw".into(), "dw_cx".into()])?;
        let (w_at, w_type) = self.address(
            inputs[1],
            vec![
                "dw_wc".into(),
                format!("(dw_tap / {}LL)", w[2]),
                format!("(dw_tap % {}LL)", w[2]),
                "0".into(),
            ],
        )?;
        let x_pack = format!("fusec::Pack<{}, 8>", c_type(x_type)?);
        let widened: Vec<String> = (0..8).map(|u| load(&format!("dw_v.v[{u}]"), x_type)).collect();
        let taps = w[1] * w[2];
        let lines = [
            format!("__shared__ __align__(16) float dw_in[{}];", in_rows * in_columns * channels),
            format!("__shared__ __align__(16) float dw_f[{}];", taps * channels),
            "long long dw_b = blockIdx.x;".into(),
            format!("const long long dw_cb = (dw_b % {channel_tiles}LL) * {channels}LL; dw_b /= {channel_tiles}LL;"),
            format!("const long long {TILE_FIRST} = (dw_b % {column_tiles}LL) * {columns}LL; dw_b /= {column_tiles}LL;"),
            format!("const long long dw_p0 = (dw_b % {row_tiles}LL) * {rows}LL;"),
            format!("const long long c0 = dw_b / {row_tiles}LL;"),
            // The input tile, zeros in the padding, widened to f32 once.
            format!(
                "for (int dw_e = threadIdx.x; dw_e < {}; dw_e += {threads}) {{ const int dw_at = dw_e / {packs}; const int dw_pk = dw_e % {packs}; const long long dw_cx = dw_cb + dw_pk * 8LL; const long long dw_ih = dw_p0 * {}LL - {}LL + dw_at / {in_columns}; const long long dw_iw = {TILE_FIRST} * {}LL - {}LL + dw_at % {in_columns}; const {x_pack} dw_v = fusec::load_or_zero(reinterpret_cast<const {x_pack}*>{x_at}, dw_ih >= 0 && dw_ih < {height}LL && dw_iw >= 0 && dw_iw < {width}LL); float4* dw_to = reinterpret_cast<float4*>(&dw_in[dw_at * {channels} + dw_pk * 8]); dw_to[0] = make_float4({}, {}, {}, {}); dw_to[1] = make_float4({}, {}, {}, {}); }}",
                in_rows * in_columns * packs,
                strides[0],
                pads[0],
                strides[1],
                pads[1],
                widened[0],
                widened[1],
                widened[2],
                widened[3],
                widened[4],
                widened[5],
                widened[6],
                widened[7],
            ),
            // The filters, tap-major.
            format!(
                "for (int dw_e = threadIdx.x; dw_e < {}; dw_e += {threads}) {{ const long long dw_wc = dw_cb + dw_e % {channels}; const long long dw_tap = dw_e / {channels}; dw_f[dw_e] = {}; }}",
                taps * channels,
                load(&format!("(*{w_at})"), w_type),
            ),
            "__syncthreads();".into(),
            format!("const int dw_pair = threadIdx.x % {}; const int dw_row = threadIdx.x / {};", channels / PAIR, channels / PAIR),
            "const long long c1 = dw_p0 + dw_row;".into(),
            format!("const long long {CHANNEL_BASE} = dw_cb + {PAIR}LL * dw_pair;"),
            format!("if (c1 >= {rows_out}LL) return;"),
            format!("float dw_acc[{columns}][{PAIR}] = {{}};"),
            format!(
                "\n#pragma unroll\nfor (int dw_kh = 0; dw_kh < {}; ++dw_kh) {{ float2 dw_x[{in_columns}];\n#pragma unroll\nfor (int dw_c = 0; dw_c < {in_columns}; ++dw_c) dw_x[dw_c] = *reinterpret_cast<const float2*>(&dw_in[((dw_row * {} + dw_kh * {}) * {in_columns} + dw_c) * {channels} + {PAIR} * dw_pair]);\n#pragma unroll\nfor (int dw_kw = 0; dw_kw < {}; ++dw_kw) {{ const float2 dw_w = *reinterpret_cast<const float2*>(&dw_f[(dw_kh * {} + dw_kw) * {channels} + {PAIR} * dw_pair]);\n#pragma unroll\nfor (int dw_t = 0; dw_t < {columns}; ++dw_t) {{ const float2 dw_xv = dw_x[dw_t * {} + dw_kw * {}]; dw_acc[dw_t][0] = fmaf(dw_xv.x, dw_w.x, dw_acc[dw_t][0]); dw_acc[dw_t][1] = fmaf(dw_xv.y, dw_w.y, dw_acc[dw_t][1]); }} }} }}",
                w[1],
                strides[0],
                dilations[0],
                w[2],
                w[2],
                strides[1],
                dilations[1],
            ),
        ];
        for line in lines {
            self.push_prologue(line);
        }
        let value = format!("dw_acc[{TILE_OFFSET}][j]");
        Ok(match inputs.get(2) {
            Some(&b) => format!("({value} + {})", self.read(b, vec![LANE.into()])?),
            None => value,
        })
    }
}
