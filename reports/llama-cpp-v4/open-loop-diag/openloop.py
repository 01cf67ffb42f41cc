"""Diagnostic: the n-gram open loop. (a) Does the calibration's logging server run slower than
the grid's plain server (the profile is fitted on logging servers' steps)? (b) The logging
server's steps of an open loop at 1.3 req/s against the simulator's steps of the same draws."""

import json
import sys
import time
from pathlib import Path

import pandas as pd

from specsim.fidelity.llama.calibrate import _logged_steps
from specsim.fidelity.llama.config import LlamaValidationConfig, SpecSetting
from specsim.fidelity.llama.held_out import HELD_OUT_V12, config_kwargs
from specsim.fidelity.llama.servers import send, start_server

REP = Path("reports/llama-cpp-v4/held-out-9")
if len(sys.argv) != 2:
    sys.exit("usage: openloop.py OUT_DIR (a new folder for runs.csv and steps.parquet)")
OUT = Path(sys.argv[1])
if OUT.exists():
    sys.exit(f"{OUT} exists: name a new folder (this never writes over a run)")
OUT.mkdir(parents=True)
kw = config_kwargs(HELD_OUT_V12)
kw["out"] = OUT
cfg = LlamaValidationConfig(**kw)
inp = json.loads((REP / "inputs.json").read_text())
ids, lengths = inp["ids"], inp["lengths"]
SEEDS = (101, 102, 103, 104)
rows, steps = [], []
for spec in ("ngram:7", "none"):
    s = SpecSetting.parse(spec)
    with (
        start_server(cfg, s, OUT / "plain") as plain,
        start_server(cfg, s, OUT / "logging", steps=True) as logsrv,
    ):
        for srv in (plain, logsrv):
            send(srv, ids[:1], [16], temperature=0.0, seed=cfg.seed, concurrency=1)
        at = _logged_steps(logsrv, 0, 1)[1]
        for seed in SEEDS:
            for load in (dict(rate=1.3, requests=12), dict(concurrency=1, requests=4)):
                for name, srv in (("plain", plain), ("logging", logsrv)):
                    t0 = time.time()
                    jobs, res, summ = send(srv, ids, lengths, temperature=0.0, seed=seed, **load)
                    row = dict(
                        spec=spec,
                        server=name,
                        seed=seed,
                        rate=load.get("rate"),
                        concurrency=load.get("concurrency"),
                        tpot_ms_mean=summ["tpot_ms_mean"],
                        throughput_tok_s=summ["throughput_tok_s"],
                        ttft_ms_mean=summ.get("ttft_ms_mean"),
                        drafted=sum(r.draft_n or 0 for r in res),
                        accepted=sum(r.draft_accepted or 0 for r in res),
                        wall_s=time.time() - t0,
                    )
                    rows.append(row)
                    print(row, flush=True)
                    if name == "logging":
                        tab, at = _logged_steps(logsrv, at, load["requests"])
                        steps.append(
                            tab.assign(
                                spec=spec,
                                seed=seed,
                                rate=load.get("rate"),
                                concurrency=load.get("concurrency"),
                            )
                        )
pd.DataFrame(rows).to_csv(OUT / "runs.csv", index=False)
pd.concat(steps, ignore_index=True).to_parquet(OUT / "steps.parquet")
print("done")
