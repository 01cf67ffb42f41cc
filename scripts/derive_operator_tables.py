"""Derive specsim's measured operator tables from Vidur's profiling data (run by hand).

Why: a step priced from a roofline with hand-set derates is wrong both ways (docs/simulator.md,
"Build a profile for your deployment"). Vidur (microsoft/vidur @ 7d47513, ``data/profiling/``,
MIT, Copyright (c) Microsoft Corporation) measured every linear, elementwise and all-reduce
operator of eight dense models on H100 and A100. This script reduces those tables to compact
curves that generalise across models, and writes them under ``specsim/data/operators/``:

- ``linear.csv``: per reference GPU and token count T, a GEMM's fixed time ``launch_us`` and the
  fraction ``roofline_frac`` of the roofline it reaches on its slope: time(T, W bytes) =
  launch + W * max(1/BW, (2/bytes_per_param) T / FLOPS) / roofline_frac(T). At a fixed T the
  memory and compute times are both proportional to W, so one weighted least-squares line per T
  (over every op, model and TP degree of the FIT models) gives both numbers;
- ``elementwise.csv``: per GPU and op (norms, rope, activation, residual add, embedding), a launch
  time and the effective bytes moved per element at the GPU's published bandwidth;
- ``all_reduce.csv``: per GPU, topology and worker count, latency + bytes / bus bandwidth (bus
  bytes = 2 (n - 1) / n x message bytes, the ring all-reduce's);
- ``heldout_linear.csv``: the HELD-OUT models' measured linear-op times (a token subsample), so
  the package's tests check the curves without this dataset.

Fit models (H100 and A100): Llama-2-7b, Llama-2-70b, Qwen-72B. Held out: CodeLlama-34b,
internlm-20b, phi-2 (H100 and A100) and Meta-Llama-3-8B / -70B (A100 only, the only GPU Vidur
profiled them on).

    python scripts/derive_operator_tables.py VIDUR_PROFILING_DIR [--out DIR]

Re-running on the same input rewrites the same files; prints the fit and held-out errors.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys

import numpy as np
import pandas as pd

# Published peaks of the two profiled GPUs (the same figures specsim/sim/cost/accelerators.py
# holds): bytes/s of HBM and dense BF16 FLOP/s. Vidur profiled in fp16/bf16 (2 bytes/param).
PEAKS = {"h100": (3.35e12, 989e12), "a100": (2.039e12, 312e12)}
NVLINK = {"h100": 450e9, "a100": 300e9}  # per direction
FIT = ("Llama-2-7b-hf", "Llama-2-70b-hf", "Qwen-72B")
LINEAR_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
ELEMENTWISE = ("input_layernorm", "post_attention_layernorm", "attn_rope", "mlp_act", "add", "emb")
HELDOUT_TOKENS = (1, 4, 16, 64, 128, 256, 512, 1024, 2048, 4096, 16384, 32768)


def linear_rows(root: str) -> pd.DataFrame:
    """One row per (GPU, model, TP, tokens, linear op): the per-GPU GEMM shape and the median ms."""
    out = []
    for f in sorted(glob.glob(os.path.join(root, "compute", "*", "*", "*", "mlp.csv"))):
        parts = f.split(os.sep)
        gpu, model = parts[-4], parts[-2]
        if gpu not in PEAKS:  # a GPU whose peaks this script does not know: not fitted
            continue
        df = pd.read_csv(f)
        h, nh, kv = df.n_embd, df.n_head, df.n_kv_head
        hd, tp, inter = h // nh, df.num_tensor_parallel_workers, df.n_expanded_embd
        up = np.where(df.use_gated_mlp, 2, 1) * inter
        shapes = {
            "attn_pre_proj": (h, (nh + 2 * kv) * hd / tp),
            "attn_post_proj": (nh * hd / tp, h),
            "mlp_up_proj": (h, up / tp),
            "mlp_down_proj": (inter / tp, h),
        }
        for op, (k, n) in shapes.items():
            out.append(pd.DataFrame({
                "gpu": gpu, "model": model, "tp": tp, "tokens": df.num_tokens, "op": op,
                "k": k, "n": n, "ms": df[f"time_stats.{op}.median"],
            }))  # fmt: skip
    d = pd.concat(out, ignore_index=True)
    d["weight_bytes"] = 2.0 * d.k * d.n
    return d


def fit_linear(d: pd.DataFrame) -> pd.DataFrame:
    """Per GPU and token count: launch_us and roofline_frac by weighted least squares (relative
    error: every op counts alike, small or large)."""
    rows = []
    for (gpu, t), g in d[d.model.isin(FIT)].groupby(["gpu", "tokens"]):
        bw, fl = PEAKS[gpu]
        w, y = g.weight_bytes.to_numpy(), g.ms.to_numpy() * 1e-3
        a = np.stack([np.ones_like(w), w], axis=1) / y[:, None]
        (c0, c1), *_ = np.linalg.lstsq(a, np.ones_like(y), rcond=None)
        if c0 < 0:  # no negative launch: refit the slope alone
            c0, c1 = 0.0, float(np.sum(w / y) / np.sum((w / y) ** 2))
        ideal = max(1.0 / bw, t / fl)
        rows.append({"gpu": gpu, "tokens": int(t), "launch_us": c0 * 1e6,
                     "roofline_frac": ideal / c1})  # fmt: skip
    return pd.DataFrame(rows)


def predict_linear(table: pd.DataFrame, gpu: str, tokens, weight_bytes) -> np.ndarray:
    """Seconds by the fitted curve on the GPU it was fitted on (the package's own reader,
    specsim.sim.cost.operators, applies the same formula and the carry rule)."""
    bw, fl = PEAKS[gpu]
    t = table[table.gpu == gpu].sort_values("tokens")
    tok = np.asarray(tokens, dtype=float)
    launch = np.interp(tok, t.tokens, t.launch_us) * 1e-6
    frac = np.interp(tok, t.tokens, t.roofline_frac)
    return launch + weight_bytes * np.maximum(1.0 / bw, tok / fl) / frac


def fit_elementwise(root: str) -> pd.DataFrame:
    """Per GPU and op: launch + elements x bytes_per_elem / BW (fit models, all TP)."""
    rows = []
    for gpu in PEAKS:
        frames = []
        for model in FIT:
            for f in glob.glob(os.path.join(root, "compute", gpu, "*", model, "mlp.csv")):
                frames.append(pd.read_csv(f))
        df = pd.concat(frames, ignore_index=True)
        hd = df.n_embd / df.n_head
        width = {
            "input_layernorm": df.n_embd, "post_attention_layernorm": df.n_embd, "add": df.n_embd,
            "emb": df.n_embd, "attn_rope": (df.n_head + df.n_kv_head) * hd
            / df.num_tensor_parallel_workers,
            "mlp_act": df.n_expanded_embd / df.num_tensor_parallel_workers,
        }  # fmt: skip
        for op in ELEMENTWISE:
            x = (df.num_tokens * width[op]).to_numpy(float)
            y = df[f"time_stats.{op}.median"].to_numpy() * 1e-3
            a = np.stack([np.ones_like(x), x], axis=1) / y[:, None]
            (c0, c1), *_ = np.linalg.lstsq(a, np.ones_like(y), rcond=None)
            rows.append({"gpu": gpu, "op": op, "launch_us": max(c0, 0.0) * 1e6,
                         "bytes_per_elem": c1 * PEAKS[gpu][0]})  # fmt: skip
    return pd.DataFrame(rows)


def fit_all_reduce(root: str) -> pd.DataFrame:
    """Per GPU, topology and workers: latency_us + bus bytes / bus_bw (medians, sizes >= 2 KB)."""
    rows = []
    for f in sorted(glob.glob(os.path.join(root, "network", "*", "all_reduce.csv"))):
        gpu, topo = os.path.basename(os.path.dirname(f)).split("_", 1)
        df = pd.read_csv(f)
        df = df[df.devices_per_node == df.num_workers]  # one node: NVLink only
        for n, g in df.groupby("num_workers"):
            g = g.groupby("size", as_index=False)["time_stats.all_reduce.median"].median()
            bus = 2.0 * (n - 1) / n * g["size"].to_numpy(float)
            y = g["time_stats.all_reduce.median"].to_numpy() * 1e-3
            a = np.stack([np.ones_like(bus), bus], axis=1) / y[:, None]
            (c0, c1), *_ = np.linalg.lstsq(a, np.ones_like(y), rcond=None)
            pred = c0 + c1 * bus
            rows.append({
                "gpu": gpu, "topology": topo, "workers": int(n), "latency_us": c0 * 1e6,
                "bus_gbps": 1e-9 / c1, "bus_frac_of_nvlink": 1.0 / c1 / NVLINK[gpu],
                "median_abs_err": float(np.median(np.abs(pred / y - 1))),
            })  # fmt: skip
    return pd.DataFrame(rows)


def report(d: pd.DataFrame, table: pd.DataFrame) -> None:
    """Median and 90th-percentile |relative error| of the curve, fit vs held-out models."""
    for gpu in PEAKS:
        x = d[(d.gpu == gpu) & (d.tokens <= 4096)]
        pred = predict_linear(table, gpu, x.tokens, x.weight_bytes)
        err = np.abs(pred / (x.ms.to_numpy() * 1e-3) - 1)
        for label, sel in (("fit", x.model.isin(FIT)), ("held-out", ~x.model.isin(FIT))):
            e = err[sel.to_numpy()]
            print(f"{gpu} linear {label}: median {np.median(e):.1%}, p90 "
                  f"{np.quantile(e, 0.9):.1%}, n={e.size}")  # fmt: skip


def check_data(root: str) -> None:
    """Refuse, before any fit, a folder that is not Vidur's profiling data or lacks a table the
    fits need (each fit model's mlp.csv on each GPU, the all-reduce tables), naming the first
    missing one: the fits would otherwise end in a KeyError or an empty concat."""
    from specsim.errors import SpecsimError

    if not os.path.isdir(os.path.join(root, "compute")):
        raise SpecsimError(
            f"no Vidur profiling data under {root!r} (no compute/ folder); give Vidur's "
            "data/profiling folder (microsoft/vidur @ 7d47513)"
        )
    for gpu in PEAKS:
        for model in FIT:
            if not glob.glob(os.path.join(root, "compute", gpu, "*", model, "mlp.csv")):
                raise SpecsimError(
                    f"{root}: no compute/{gpu}/*/{model}/mlp.csv; the linear and elementwise "
                    "fits need every fit model on every GPU"
                )
    if not glob.glob(os.path.join(root, "network", "*", "all_reduce.csv")):
        raise SpecsimError(f"{root}: no network/*/all_reduce.csv; the all-reduce fit needs them")


def check_folder(path: str, flag: str, create: bool) -> None:
    """An output folder that exists (or, with ``create``, can be made) and is writable."""
    from specsim.errors import SpecsimError

    if os.path.exists(path) and not os.path.isdir(path):
        raise SpecsimError(f"{flag} {path} is a file; give a folder")
    base = path
    while create and not os.path.exists(base):
        base = os.path.dirname(os.path.abspath(base))
    if not os.path.isdir(base):
        raise SpecsimError(f"{flag} {path} does not exist; create it first")
    if not os.access(base, os.W_OK | os.X_OK):
        raise SpecsimError(f"{flag} {path}: folder {base} is not writable; choose another")


def main(argv: list[str] | None = None) -> int:
    from specsim.errors import LineParser, run_script

    ap = LineParser(prog="derive_operator_tables.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("root", help="Vidur's data/profiling folder (microsoft/vidur @ 7d47513)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "specsim",
                                                  "data", "operators"))  # fmt: skip
    tests_data = os.path.join(os.path.dirname(__file__), "..", "tests", "data")
    ap.add_argument("--heldout-dir", default=tests_data,
                    help="where the held-out models' times go (the tests read them)")  # fmt: skip
    args = ap.parse_args(argv)
    return run_script(ap.prog, lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    """Every check, then every fit, then the four files (each written through a temporary
    name): a failure leaves the old tables whole, never half of a new set."""
    from specsim.outputs import write_table

    check_data(args.root)
    check_folder(args.out, "--out", create=True)
    check_folder(args.heldout_dir, "--heldout-dir", create=False)
    d = linear_rows(args.root)
    table = fit_linear(d)
    elementwise = fit_elementwise(args.root)
    ar = fit_all_reduce(args.root)
    held = d[~d.model.isin(FIT) & d.tokens.isin(HELDOUT_TOKENS)]
    os.makedirs(args.out, exist_ok=True)
    write_table(table.round(6), os.path.join(args.out, "linear.csv"))
    write_table(elementwise.round(6), os.path.join(args.out, "elementwise.csv"))
    write_table(ar.round(6), os.path.join(args.out, "all_reduce.csv"))
    write_table(held[["gpu", "model", "tp", "tokens", "op", "k", "n", "ms"]],
                os.path.join(args.heldout_dir, "vidur_heldout_linear.csv"))  # fmt: skip
    report(d, table)
    print(ar.to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
