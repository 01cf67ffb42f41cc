"""What llama-server's step log costs: a grid's calibration runs on a server logging every step
(``-lv 5``, as ``validate --step-clock server`` calibrates) and on one at info level (as the
grid's cells run), interleaved, the same jobs.

Why: the profile is fitted on the steps of the logging server and scored on runs of the quiet
one, so any cost of the log itself is in every fitted price (reports/llama-cpp-v4/PLAN.md,
step 9). Run it alone on the machine:

    python scripts/measure_log_cost.py reports/llama-cpp-v4/held-out-3/config.json \\
        --specs none,ngram:3,dspark:7 --cycles 2 --out reports/llama-cpp-v4/log-cost.csv

Each cycle starts each setting's two servers in turn (the order alternating by cycle), sends
one warm-up request, then every calibration load of the config at each temperature. Writes one
row per run and prints each load's median throughput on both and how much slower the logging
server was.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def measure(config: Path, specs: list[str], cycles: int, log_dir: Path) -> list[dict]:
    """The calibration runs of ``config`` on both servers of every setting in ``specs``."""
    from specsim.fidelity.llama.config import LlamaValidationConfig, SpecSetting
    from specsim.fidelity.llama.servers import start_server
    from specsim.fidelity.llama.traces import natural_lengths
    from specsim.prompts import load_many
    from specsim.serve.llama_tokens import chat_prompt_ids

    conf = json.loads(config.read_text())
    fields = LlamaValidationConfig.__dataclass_fields__
    kw = {k: (tuple(v) if isinstance(v, list) else v) for k, v in conf.items() if k in fields}
    cfg = LlamaValidationConfig(**{**kw, "out": log_dir, "force": True})
    log_dir.mkdir(parents=True, exist_ok=True)
    texts = [p.text for p in load_many([cfg.calib_prompts])]
    with start_server(cfg, SpecSetting("none"), log_dir) as srv:
        ids = chat_prompt_ids(srv, texts)
        lengths = natural_lengths(srv, ids, cfg)
    rows = []
    for cycle in range(cycles):
        for spec in specs:
            s = SpecSetting.parse(spec)
            for logged in (False, True) if cycle % 2 == 0 else (True, False):
                with start_server(cfg, s, log_dir, steps=logged) as srv:
                    rows += _runs(cfg, srv, ids, lengths, {"cycle": cycle, "spec": s.name,
                                                           "step_log": logged})  # fmt: skip
    return rows


def _runs(cfg, srv, ids: list, lengths: list, tags: dict) -> list[dict]:  # noqa: ANN001
    """One server's warm-up request, then every calibration load at each temperature."""
    import numpy as np

    from specsim.fidelity.llama.servers import send

    send(srv, ids[:1], [min(lengths[0], 16)], temperature=0.0, seed=cfg.seed, concurrency=1)
    rows = []
    for t in cfg.temperatures:
        for c in cfg.calib_concurrency:
            n = int(np.ceil(cfg.calib_requests * c))
            _, _, summ = send(srv, ids, lengths, temperature=t, seed=cfg.seed + 1,
                              concurrency=c, requests=n)  # fmt: skip
            rows.append({**tags, "temperature": float(t), "concurrency": c, "requests": n,
                         "throughput_tok_s": summ["throughput_tok_s"],
                         "tpot_ms_mean": summ["tpot_ms_mean"]})  # fmt: skip
            print(f"{tags} T={t:g} C={c}: {summ['throughput_tok_s']:.1f} tok/s", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    from specsim.errors import LineParser, run_script

    ap = LineParser(prog="measure_log_cost.py", description=__doc__.split("\n")[0])
    ap.add_argument("config", type=Path, help="a llama-server grid's config.json")
    ap.add_argument("--specs", default="none,ngram:3,dspark:7", help="settings to measure")
    ap.add_argument("--cycles", type=int, default=2, help="interleaved cycles (>= 1)")
    ap.add_argument("--out", type=Path, required=True, help="CSV to write")
    ap.add_argument("--force", action="store_true", help="overwrite --out")
    args = ap.parse_args(argv)
    return run_script(ap.prog, lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    import tempfile

    import pandas as pd

    from specsim.errors import SpecsimError
    from specsim.outputs import check_out, write_table

    if args.cycles < 1:
        raise SpecsimError(f"--cycles must be at least 1, got {args.cycles}")
    if not args.config.is_file():
        raise SpecsimError(f"{args.config} is not a file: give a grid's config.json")
    out = check_out(args.out, force=args.force, suffixes=(".csv",))
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        rows = measure(args.config, args.specs.split(","), args.cycles, Path(tmp))
    table = pd.DataFrame(rows)
    write_table(table, out)
    keys = ["spec", "temperature", "concurrency"]
    m = table.groupby([*keys, "step_log"]).throughput_tok_s.median().unstack()
    m["log_slower"] = m[False] / m[True] - 1.0
    print(m.round(3).to_string())
    print(f"load before {load0[0]:.2f}, after {os.getloadavg()[0]:.2f}; wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
