#!/usr/bin/env python3
"""benches/RESULTS.md and the latency plot from the suite's JSON results (standard library
only, so it runs anywhere).

    python3 benches/report.py RESULTS_DIR RESULTS.md PLOT.svg

RESULTS_DIR holds `fusec bench --json` files (fusec-*.json), compare_torch.py output
(torch-*.json; the newest record per system and case wins) and gpu.txt.
"""

import datetime
import glob
import html
import json
import math
import os
import re
import subprocess
import sys

SYSTEMS = ["fusec unfused", "fusec fused", "torch eager", "torch compile", "torch reduce-overhead"]
COLORS = ["#b0b0b0", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"]


def load(results):
    rows = {}    # (case, shape, dtype) -> {system: record}
    extra = {}   # (case, shape, dtype) -> fusec bench json
    meta = {}
    for path in sorted(glob.glob(os.path.join(results, "fusec-*.json"))):
        with open(path) as f:
            d = json.load(f)
        name = os.path.basename(d["model"]).removesuffix(".onnx")
        shape = d["inputs"][0]["shape"]
        last = name.rsplit("_", 1)[-1]
        case = name.rsplit("_", 1)[0] if "x" in last and last[0].isdigit() else name
        key = (case, "x".join(map(str, shape)), {"f32": "fp32", "f16": "fp16", "bf16": "bf16"}[d["precision"].lower()])
        for v in d["variants"]:
            rows.setdefault(key, {})[f"fusec {v['variant']}"] = v
        extra[key] = d
        meta.setdefault("device", d["device"])
        meta.setdefault("rates", d["rates"])
    for path in sorted(glob.glob(os.path.join(results, "torch-*.json"))):
        with open(path) as f:
            d = json.load(f)
        meta["torch"] = d["meta"]
        for r in d["records"]:
            shape = f"{r['batch']}x{r['seq']}" if "batch" in r else f"{r['rows']}x{r['hidden']}"
            rows.setdefault((r["case"], shape, r["dtype"]), {})[r["system"]] = r
    gpu = os.path.join(results, "gpu.txt")
    if os.path.exists(gpu):
        meta["gpu"] = open(gpu).read().strip()
    return rows, extra, meta


def ms(record):
    if not record or "median_ms" not in record or record.get("check") not in (None, "pass"):
        return None
    return record["median_ms"]


def cell(record):
    if record is None:
        return "—"
    if record.get("check") == "error":
        return "error"
    if record.get("check") == "FAIL":
        return f"check failed ({record['rel_l2_vs_eager_f32']:.1e})"
    return f"{record['median_ms']:.3f} ({record['p10_ms']:.3f}–{record['p90_ms']:.3f})"


def shape_key(shape):
    return tuple(int(x) for x in shape.split("x"))


def table(rows, extra, micro):
    keys = sorted((k for k in rows if (k[0].startswith("bias_")) == micro),
                  key=lambda k: (k[0], k[2], shape_key(k[1])))
    head = ["case", "shape", "dtype"] + SYSTEMS + ["fused / unfused", "best torch / fused", "floor (ms)",
                                                   "launches"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key in keys:
        r = rows[key]
        fused, unfused = ms(r.get("fusec fused")), ms(r.get("fusec unfused"))
        torch_best = [t for t in (ms(r.get(s)) for s in SYSTEMS[2:]) if t is not None]
        speed = f"{unfused / fused:.2f}x" if fused and unfused else "—"
        vs_torch = f"{min(torch_best) / fused:.2f}x" if fused and torch_best else "—"
        floor = r.get("fusec fused", {}).get("floor_ms")
        launches = "—"
        if "fusec fused" in r and "fusec unfused" in r:
            launches = f"{r['fusec unfused']['launches']} → {r['fusec fused']['launches']}"
        lines.append("| " + " | ".join([key[0], key[1], key[2]] + [cell(r.get(s)) for s in SYSTEMS]
                                      + [speed, vs_torch, f"{floor:.3f}" if floor else "—", launches]) + " |")
    return "\n".join(lines)


def step_kind(name):
    """A profile step's kind: the kernel name without its number, a GEMM without its size."""
    name = re.sub(r"fusec_k\d+_", "", name)
    name = re.sub(r"\d+x\d+x\d+", "MxNxK", name)
    return name


# Hidden size (heads × head size) of the suite's models: attention's FLOPs at B×S are
# 4·B·S²·hidden per layer (Q·Kᵀ and P·V, the full square also under a causal mask).
HIDDEN = {"bert_base": 768, "gpt2_small": 768, "llama_style": 768}


def profiles(extra):
    out = []
    for key, d in sorted(extra.items()):
        if not d.get("profile"):
            continue
        steps = d["profile"]
        graph = all(s.get("repeated_ms") is not None for s in steps)
        time = (lambda s: s["repeated_ms"]) if graph else (lambda s: s["ms"])
        total = sum(time(s) for s in steps) or 1.0
        alone_total = sum(s["ms"] for s in steps)
        kinds = {}
        for s in steps:
            count, ms, alone = kinds.get(step_kind(s["step"]), (0, 0.0, 0.0))
            kinds[step_kind(s["step"])] = (count + 1, ms + time(s), alone + s["ms"])
        fused_ms = next((v["median_ms"] for v in d.get("variants", []) if v["variant"] == "fused"), float("nan"))
        if graph:
            how = (f"{total:.3f} ms of GPU time without launches, each step repeated 20 times back to back "
                   f"in a CUDA graph (the program's graph replay: {fused_ms:.3f} ms); "
                   f"{alone_total:.3f} ms when each step is issued alone with its launch")
        else:
            how = f"{total:.3f} ms step by step; each step timed alone, so each includes its launch"
        out.append(f"**{key[0]} {key[1]} {key[2]}** ({len(steps)} steps, {how}):\n")
        out.append("| steps | kind | ms | share | µs per step | µs per step alone |")
        out.append("|---|---|---|---|---|---|")
        for kind, (count, ms, alone) in sorted(kinds.items(), key=lambda kv: -kv[1][1]):
            out.append(f"| {count} | `{kind}` | {ms:.4f} | {100 * ms / total:.1f}% | {1e3 * ms / count:.1f} | {1e3 * alone / count:.1f} |")
        out.append("")
        attention = kinds.get("attention")
        m = re.fullmatch(r"(\d+)x(\d+)", key[1])
        if attention and m and key[0] in HIDDEN:
            b, s_ = int(m.group(1)), int(m.group(2))
            flops = 4 * b * s_ * s_ * HIDDEN[key[0]]
            per = attention[1] / attention[0]
            out.append(f"Attention: {1e3 * per:.1f} µs per layer ({'GPU time, repeated in a graph' if graph else 'alone, launch included'}), "
                       f"{flops / 1e9:.3f} GFLOP each: {flops / (per * 1e-3) / 1e12:.1f} TFLOP/s.\n")
        gemms = d.get("gemm_choices") or []
        if gemms:
            out.append("GEMM algorithms kept (the fused program timed with each candidate):\n")
            for g in gemms:
                cached = " (cached)" if g.get("cached") else f" (program {g['first_us'] / 1e3:.4f} → {g['chosen_us'] / 1e3:.4f} ms)"
                cublas = g.get("reference") == "Cublas"
                reference = "cuBLAS" if cublas else "cuBLASLt's first algorithm"
                heuristic = g.get("heuristic", g["candidates"])
                if g["chosen"] == 0:
                    what = f"{reference} kept"
                elif g["chosen"] >= heuristic:
                    what = f"cuBLASLt variant {g['chosen'] - heuristic + 1} of {g['candidates'] - heuristic}"
                elif cublas:
                    what = f"cuBLASLt algorithm {g['chosen']} of {heuristic - 1} (over cuBLAS)"
                else:
                    what = f"cuBLASLt algorithm {g['chosen'] + 1} of {heuristic}"
                config = f": {g['config']}" if g.get("config") else ""
                out.append(f"- `{g['gemm']}`: {what}{cached}{config}")
            out.append("")
    return "\n".join(out)


def plot(rows, path):
    keys = sorted(rows, key=lambda k: (k[0].startswith("bias_"), k[0], k[2], shape_key(k[1])))
    values = [v for k in keys for v in (ms(rows[k].get(s)) for s in SYSTEMS) if v]
    if not values:
        return
    lo, hi = math.floor(math.log10(min(values))), math.ceil(math.log10(max(values)))
    bar, gap, left, width = 9, 14, 250, 620
    height = 60 + len(keys) * (len(SYSTEMS) * bar + gap) + 40
    x = lambda v: left + width * (math.log10(v) - lo) / max(hi - lo, 1)  # noqa: E731
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 40}" height="{height}" '
           'font-family="sans-serif" font-size="11">',
           f'<text x="10" y="20" font-size="14">Latency per system (median ms, log scale; lower is better)</text>']
    for i, (s, c) in enumerate(zip(SYSTEMS, COLORS)):
        svg.append(f'<rect x="{10 + i * 150}" y="32" width="10" height="10" fill="{c}"/>'
                   f'<text x="{24 + i * 150}" y="41">{html.escape(s)}</text>')
    y = 60
    for d in range(lo, hi + 1):
        svg.append(f'<line x1="{x(10 ** d):.1f}" y1="55" x2="{x(10 ** d):.1f}" y2="{height - 35}" stroke="#ddd"/>'
                   f'<text x="{x(10 ** d):.1f}" y="{height - 20}" text-anchor="middle">{10 ** d:g} ms</text>')
    for key in keys:
        svg.append(f'<text x="{left - 8}" y="{y + len(SYSTEMS) * bar / 2 + 4}" text-anchor="end">'
                   f'{html.escape(" ".join(key))}</text>')
        for s, c in zip(SYSTEMS, COLORS):
            v = ms(rows[key].get(s))
            if v:
                svg.append(f'<rect x="{left}" y="{y}" width="{max(x(v) - left, 1):.1f}" height="{bar - 1}" '
                           f'fill="{c}"><title>{html.escape(s)}: {v:.3f} ms</title></rect>')
            y += bar
        y += gap
    svg.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(svg) + "\n")


def ranges(results):
    """The `fusec bench --sizes` tables (sizes-*.json): a bundle for a range of sizes against
    one bundle per size, side by side in one run."""
    files = sorted(glob.glob(os.path.join(results, "sizes-*.json")))
    if not files:
        return "No `fusec bench --sizes` results.\n"
    try:
        with open(os.path.join(results, "sizes-commit.txt")) as f:
            rev = f.read().strip()
    except OSError:
        rev = "unknown"
    out = ["`fusec bench MODEL --dim NAME=LO..HI ... --sizes ...`: at each point of the ranges, the "
           "bundle for the ranges against a bundle compiled for that point alone (medians of the runs "
           "named, CUDA events, input sets rotated); the first run of a point is its set-up (launches "
           "scaled, cuBLASLt descriptors), graph capture and run after the session's first run, "
           "timed on the host without copying inputs and outputs.\n"]
    for path in files:
        with open(path) as f:
            d = json.load(f)
        # One range (`range`, sizes by `size`) before bundle format 6; ranges and points since.
        ranges = d.get("ranges") or [d["range"]]
        try:
            with open(path.removesuffix(".json") + ".commit") as f:
                at = f.read().strip()
        except OSError:
            at = rev
        name = os.path.basename(d["model"]).removesuffix(".onnx")
        spans = " ".join(f"{r['name']}={r['low']}..{r['high']}" for r in ranges)
        out.append(f"**{name}**, {d['precision'].lower()}, {spans} (fusec at {at}; "
                   f"{os.path.basename(path)}; {d['iterations']} runs on {d['device']}):\n")
        label = "×".join(r["name"] for r in ranges)
        out.append(f"| {label} | bundle for the ranges (ms) | p10–p90 | bundle for that point (ms) | ratio | first run (ms) | of which set-up (ms) |")
        out.append("|---|---|---|---|---|---|---|")
        for s in d["sizes"]:
            point = "×".join(str(v) for v in s.get("point", [s["size"]]))
            out.append(f"| {point} | {s['range_median_ms']:.3f} | {s['range_p10_ms']:.3f}–{s['range_p90_ms']:.3f} | "
                       f"{s['alone_median_ms']:.3f} | {s['ratio']:.3f}x | {s['first_run_ms']:.2f} | {s['setup_ms']:.2f} |")
        out.append("")
    return "\n".join(out)


def main():
    results, out, svg = sys.argv[1:4]
    rows, extra, meta = load(results)
    plot(rows, svg)
    rates = meta.get("rates", {})
    # The commit the fusec binary was built from, as scripts/gpu-stage.sh recorded it and
    # run.sh copied it beside the results (the GPU machine has no git); else this checkout's,
    # marked as such.
    try:
        with open(os.path.join(results, "fusec-commit.txt")) as f:
            rev = f.read().strip()
    except OSError:
        try:
            rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                 check=True).stdout.strip() + " (the checkout the report ran in)"
        except (OSError, subprocess.CalledProcessError):
            rev = "unknown"
    t = meta.get("torch", {})
    text = f"""# Benchmark results

Generated by `benches/run.sh` (report part: `benches/report.py`) on {datetime.date.today()}
from the JSON files in `benches/results/`. Every number comes from the same GPU kind; the
files may come from more than one run of the suite's parts (see benches/README.md for how
the current ones were collected).

- GPU: {meta.get('gpu', meta.get('device', 'unknown'))}
- Measured there at start-up by `fusec bench`: copy {rates.get('copy_bytes_per_s', 0) / 1e12:.2f} TB/s
  (read + write), GEMM {rates.get('gemm_flops_per_s', 0) / 1e12:.1f} TFLOP/s ({rates.get('gemm_dtype', '?')}; the
  fp16 rows use the fp16 rate)
- torch {t.get('torch', '?')} (CUDA {t.get('cuda', '?')}), transformers {t.get('transformers', '?')}; fusec at {rev}

Method: each cell is the median latency in ms (p10–p90 in brackets) of 100 runs after 20
warm-up runs, timed with CUDA events around each run, four random non-zero input sets
rotated (token ids in [1, 1000); floats in [-1, 1); fusec uses one set when the inputs exceed
16 MB, as for the pointwise chains, where rotating only adds uploads). fusec checks fused against unfused
outputs before timing (rel-L2 ≤ 1e-5 f32, 1e-2 f16); compare_torch.py checks every compiled
variant against eager f32 (1e-4 f32, 2e-2 f16). The default-mode torch.compile runs at the
shapes `--compile-shapes` names (the suite's default: 8x128 only; it never beat reduce-overhead
on a row measured, and each compile takes 8–18 s); "—" marks a cell not run. fusec unfused is one kernel per ONNX node,
GEMMs on cuBLAS, no CUDA graph; fused replays one CUDA graph. torch.compile is static per
shape; TF32 is off everywhere. fusec's fp16 keeps inputs and outputs f32 (weights and
activations are f16). The floor is max(FLOPs / GEMM rate, estimated HBM bytes / copy
bandwidth) for the fused program. Weights are random (fusec and torch draw their own);
latency does not depend on their values.

## Models (Hugging Face BERT-base, GPT-2 small and a Llama-style decoder)

{table(rows, extra, micro=False)}

## Pointwise chains (f32)

`bias_gelu`: gelu(x + b) with exact GELU. `bias_dropout_residual_layernorm`:
layer_norm(dropout(x + b) + residual), inference. Shapes are rows × hidden.

{table(rows, extra, micro=True)}

## One bundle for a range of batch sizes (`fusec bench --sizes`)

{ranges(results)}
## Where the fused time goes (`fusec bench --profile`)

{profiles(extra)}
![latency per system]({os.path.basename(svg)})

## Hand-collected results

Not generated by `report.py`; each in a file of its own under `benches/collected/`, newest
figures at the end of each:

- [`collected/convolutional-networks.md`](collected/convolutional-networks.md): torchvision
  classifiers and ViT-B/16 against PyTorch, and a CNN bundle for a range of batches.
- [`collected/decoding.md`](collected/decoding.md): `fusec generate` and `bench --decode` (GPT-2
  small and the Llama-style decoder) against PyTorch's static-cache decoding, and #27's bounds.
- [`collected/python.md`](collected/python.md): fusec from Python (`benches/python_api.py`).
"""
    with open(out, "w") as f:
        f.write(text)
    print(f"wrote {out} and {svg}: {len(rows)} cases")


if __name__ == "__main__":
    main()
