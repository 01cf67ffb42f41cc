"""The simulator's steps for the diagnostic's draws (held-out-9's profile and traces), against
the logging server's steps of the same draws."""

import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from specsim.fidelity.llama.config import LlamaValidationConfig, SpecSetting
from specsim.fidelity.llama.grid import new_slots
from specsim.fidelity.llama.held_out import HELD_OUT_V12, config_kwargs
from specsim.fidelity.llama.servers import limits
from specsim.sim.cost.profiles import read_profile_csv
from specsim.sim.simulate import replay
from specsim.trace.io import read_trace

REP = Path("reports/llama-cpp-v4/held-out-9")
RUN = Path(sys.argv[1]) if len(sys.argv) > 1 else None
kw = config_kwargs(HELD_OUT_V12)
kw["out"] = Path(tempfile.mkdtemp())  # the config wants a folder; nothing is written
cfg = LlamaValidationConfig(**kw)
cost = read_profile_csv(REP / "profile-t0.csv")
warnings.filterwarnings("ignore")
out = []
for spec in ("ngram:7", "none"):
    s = SpecSetting.parse(spec)
    tr = read_trace(REP / "traces" / f"trace-{s.slug}-t0.parquet")
    for seed in (101, 102, 103, 104):
        for load in (dict(rate=1.3), dict(concurrency=1)):
            n = 12 if "rate" in load else 4
            for k in range(5):
                res = replay(
                    tr,
                    s.policy,
                    requests=n,
                    seed=seed,
                    profile=cost,
                    serving="v2",
                    kv="reserve",
                    record_tokens=False,
                    record_steps=True,
                    slots=new_slots(cfg, None, k),
                    **limits(cfg),
                    **load,
                )
                st = res.steps
                req = res.requests
                out.append(
                    dict(
                        spec=spec,
                        seed=seed,
                        load=str(load),
                        layout=k,
                        steps=len(st),
                        busy_s=float(st.duration_s.sum()),
                        tpot=res.summary.get("tpot_ms_mean"),
                        mean_dec=float((st.decoding).mean()),
                        mean_B=float(st.batch_tokens.mean()),
                        prefill_steps=int((st.prefill_tokens > 0).sum()),
                    )
                )
df = pd.DataFrame(out)
print(
    df.groupby(["spec", "load", "seed"])[
        ["steps", "busy_s", "tpot", "mean_dec", "mean_B", "prefill_steps"]
    ]
    .median()
    .round(3)
    .to_string()
)
if RUN:
    real = pd.read_parquet(RUN / "steps.parquet")
    real["load"] = np.where(real.rate.notna(), "{'rate': 1.3}", "{'concurrency': 1}")
    g = real.groupby(["spec", "load", "seed"]).agg(
        steps=("duration_s", "size"),
        busy_s=("duration_s", "sum"),
        mean_dec=("decoding", "mean"),
        mean_B=("batch_tokens", "mean"),
        prefill_steps=("prefill_tokens", lambda x: int((x > 0).sum())),
    )
    print(g.round(3).to_string())
    runs = pd.read_csv(RUN / "runs.csv")
    print(
        runs.groupby(["spec", "server", "rate", "concurrency"], dropna=False)[
            ["tpot_ms_mean", "throughput_tok_s", "drafted", "accepted"]
        ]
        .mean()
        .round(2)
        .to_string()
    )
