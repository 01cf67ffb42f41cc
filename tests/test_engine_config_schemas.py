"""The configs ``specsim tune`` prints, parsed the way each engine parses them and checked
against a schema read from that engine's own source (tests/data/engine_config_schemas.json).

Why a schema and not the engine's config class: vLLM, TensorRT-LLM, SGLang and llama.cpp do not
install without a GPU (CUDA wheels, a C++ build), so the test cannot construct
``SpeculativeConfig`` or ``DSparkDecodingConfig``. Instead the field and flag names, their types,
their literal choices and the validators' cross-field rules were read from the engines' source
and written down, with the file and commit each came from:

- vLLM: ``vllm/config/speculative.py`` (vllm-project/vllm@002e77c1), ``SpeculativeConfig``.
- TensorRT-LLM: ``tensorrt_llm/llmapi/llm_args.py`` (NVIDIA/TensorRT-LLM@00043967),
  ``DecodingBaseConfig`` and ``DSparkDecodingConfig``; the confidence-scheduling fields, absent
  from that source, from the 1.4.0rc4 API reference's signature of ``DSparkDecodingConfig``
  (kept apart in the schema, and checked apart here).
- SGLang: ``python/sglang/srt/server_args.py`` (sgl-project/sglang@001067ff), the speculative
  ``ServerArgs`` fields, and ``python/sglang/srt/arg_groups/speculative_hook.py`` (@004c82e0),
  ``_handle_dspark``.
- llama.cpp: ``common/arg.cpp`` (ggml-org/llama.cpp@0017d6fb), the speculative ``add_opt``
  block, and ``common/speculative.cpp`` (@001d906a), the ``--spec-type`` names.

Every rendering is one tune can print: each engine's grid from :func:`specsim.analysis.tune.grid
.candidates` (no speculation, the default row, every draft length, gain and p-min) over several
block sizes and ``--draft-lens``, and TensorRT-LLM's tuned ``draft_len_schedule``. A config is
parsed as the engine reads it (``shlex.split`` for a command line, ``json.loads`` for vLLM's
flag value, ``yaml.safe_load`` for TensorRT-LLM's YAML when PyYAML is installed), then every
key or flag must be in the schema, every value of the schema's type and choices, and the
required ones present. Where specsim prints something the source does not accept the test is
a bug in specsim: the three found when this test was written (confidence fields printed for
releases without them, a tuned ``draft_len_schedule`` that grew with the batch, gains that YAML
read back as strings) are fixed and each has its test below.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from specsim.analysis.tune.configs import render
from specsim.analysis.tune.grid import Candidate, candidates, schedule_candidate
from specsim.analysis.tune.run import DEFAULT_GAINS, DEFAULT_P_MINS, TuneConfig, tuned_schedule

try:  # the YAML as PyYAML reads it (llm_args.py imports yaml); without it, the printed dict
    import yaml
except ImportError:  # pragma: no cover - PyYAML is a dev dependency here
    yaml = None

SCHEMAS = json.loads(
    (Path(__file__).parent / "data" / "engine_config_schemas.json").read_text(encoding="utf-8")
)
ENGINES = ("vllm", "trtllm", "sglang", "llama")
BLOCKS = (1, 2, 4, 7, 16)
DRAFT_LENS = (None, (1, 3, 7, 40))  # the default 1..block, and a --draft-lens past the block
EXTRA_GAINS = (0.01, 0.5, 3.0)  # --gains a user may give (>= 0), beside the default grid
EXTRA_P_MINS = (0.05, 0.25, 0.95, 1.0)  # --p-mins in [0, 1]
# tuned_schedule merges the best fixed length per searched load: a shrinking ladder is valid
TUNED_SCHEDULES = (((1, 7), (8, 4), (32, 2)), ((4, 3),), ((1, 2), (64, 1)))
LENS_KNOB = {"vllm": "num_speculative_tokens", "trtllm": "max_draft_len",
             "sglang": "speculative_dspark_block_size", "llama": "spec_draft_n_max"}  # fmt: skip


# ------------------------------------------------------------------ the renderings tune prints
def grid(engine: str) -> list[tuple[int, Candidate]]:
    """(block, candidate) for every setting tune can search for ``engine``."""
    out: list[tuple[int, Candidate]] = []
    for block in BLOCKS:
        for lens in DRAFT_LENS:
            for gains, p_mins in ((DEFAULT_GAINS, DEFAULT_P_MINS), (EXTRA_GAINS, EXTRA_P_MINS)):
                cfg = TuneConfig(
                    engine=engine, concurrency=(8,), draft_lens=lens, gains=gains, p_mins=p_mins
                )
                out += [(block, c) for c in candidates(cfg, block)]
    if engine == "trtllm":
        for sched in TUNED_SCHEDULES:
            out.append((7, schedule_candidate(sched, "tuned across these loads")))
    return out


def speculating(engine: str) -> list[tuple[int, Candidate]]:
    return [(b, c) for b, c in grid(engine) if c.knobs]


def render_row(engine: str, block: int, cand: Candidate, drafter: str | None = None):
    return render(engine, cand.knob_dict(), block=block, drafter=drafter)


# ------------------------------------------------------------------ parsing as the engine does
def parse_vllm(text: str) -> dict[str, Any]:
    """``--speculative-config JSON``: one flag whose value is a JSON object."""
    argv = shlex.split(text)
    assert len(argv) == 2 and argv[0] == "--speculative-config", argv
    obj = json.loads(argv[1])
    assert isinstance(obj, dict)
    return obj


def parse_trtllm(text: str, data: dict[str, Any]) -> dict[str, Any]:
    """The ``speculative_config`` mapping of the YAML (PyYAML), else the printed dict."""
    if yaml is None:
        return data
    doc = yaml.safe_load(text)
    assert isinstance(doc, dict) and list(doc) == ["speculative_config"], doc
    return doc["speculative_config"]


def parse_flags(text: str, flags: dict[str, dict]) -> tuple[dict[str, str], list[str]]:
    """Command-line flags to {canonical flag: raw value}, and what the engine would refuse
    (an unknown flag, a flag without its value, a flag given twice)."""
    alias = {a: name for name, spec in flags.items() for a in [name, *spec.get("aliases", [])]}
    argv, out, errors, i = shlex.split(text), {}, [], 0
    while i < len(argv):
        tok = argv[i]
        name = alias.get(tok)
        if name is None:
            errors.append(f"{tok!r} is not a flag the source registers")
            i += 1
            continue
        if name in out:
            errors.append(f"{tok} given twice")
        if flags[name]["takes_value"]:
            if i + 1 >= len(argv) or argv[i + 1] in alias:
                errors.append(f"{tok} without its value")
                i += 1
                continue
            out[name] = argv[i + 1]
            i += 2
        else:
            out[name] = ""
            i += 1
    return out, errors


# ------------------------------------------------------------------ checking against the schema
INT = re.compile(r"[+-]?\d+")


def value_errors(name: str, value: Any, spec: dict) -> list[str]:
    """A parsed (typed) value against its schema entry."""
    kind, errs = spec["type"], []
    ok = {
        "bool": lambda v: isinstance(v, bool),
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "str": lambda v: isinstance(v, str) and v != "",
        "path": lambda v: isinstance(v, str) and v != "",
        "dict[int,int]": lambda v: (
            isinstance(v, dict) and all(type(k) is int and type(x) is int for k, x in v.items())
        ),
    }[kind](value)
    if not ok:
        return [f"{name}={value!r} is not {kind}"]
    if "choices" in spec and value not in spec["choices"]:
        errs.append(f"{name}={value!r} is not one of {spec['choices']}")
    if "gt" in spec and not value > spec["gt"]:
        errs.append(f"{name}={value!r} is not > {spec['gt']}")
    if "ge" in spec and not value >= spec["ge"]:
        errs.append(f"{name}={value!r} is not >= {spec['ge']}")
    if kind == "float" and not math.isfinite(value):
        errs.append(f"{name}={value!r} is not finite")
    return errs


def mapping_errors(obj: dict[str, Any], fields: dict[str, dict], required) -> list[str]:
    """A JSON/YAML mapping: known keys, typed values, required keys, cross-field rules."""
    errs = [f"{k!r} is not a field the source declares" for k in obj if k not in fields]
    errs += [f"required {k!r} missing" for k in required if k not in obj]
    for k, v in obj.items():
        spec = fields.get(k)
        if spec is None:
            continue
        errs += value_errors(k, v, spec)
        for other, want in spec.get("only_with", {}).items():
            if v and obj.get(other) != want:
                errs.append(f"{k}={v!r} needs {other}={want!r}, got {obj.get(other)!r}")
        if spec["type"] == "dict[int,int]" and isinstance(v, dict) and v:
            errs += schedule_errors(k, v, obj, spec)
    return errs


def schedule_errors(name: str, sched: dict, obj: dict, spec: dict) -> list[str]:
    """TensorRT-LLM's validate_draft_len_schedule_and_sort."""
    errs = [f"{name}: batch size {b} < {spec['key_ge']}" for b in sched if b < spec["key_ge"]]
    errs += [f"{name}: draft length {k} < {spec['value_ge']}" for k in sched.values()
             if k < spec["value_ge"]]  # fmt: skip
    top = obj.get(spec["smallest_key_maps_to"])
    if top is not None:
        first = sched[min(sched)]
        if first != top:
            errs.append(f"{name}[{min(sched)}]={first} must equal max_draft_len={top}")
        errs += [f"{name}[{b}]={k} > max_draft_len={top}" for b, k in sched.items() if k > top]
    return errs


def flag_errors(values: dict[str, str], flags: dict[str, dict], required) -> list[str]:
    """Raw flag values, converted as the engine's parser converts them, against the schema."""
    errs = [f"required {f} missing" for f in required if f not in values]
    typed: dict[str, Any] = {}
    for f, raw in values.items():
        spec = flags[f]
        kind = spec["type"]
        if kind == "int":
            if not INT.fullmatch(raw):
                errs.append(f"{f} {raw!r} is not an int")
                continue
            typed[f] = int(raw)
        elif kind == "float":
            try:
                typed[f] = float(raw)
            except ValueError:
                errs.append(f"{f} {raw!r} is not a float")
                continue
        elif kind == "list[str]":
            items = raw.split(spec["separator"])
            errs += [f"{f}: {x!r} is not one of {spec['choices']}" for x in items
                     if x not in spec["choices"]]  # fmt: skip
            continue
        else:
            typed[f] = raw
        errs += value_errors(f, typed[f], spec)
    for f, spec in flags.items():
        rule = spec.get("equals")
        if rule and f in typed and rule["flag"] in typed:
            want = typed[rule["flag"]] + rule["plus"]
            if typed[f] != want:
                errs.append(f"{f}={typed[f]} must equal {rule['flag']} + {rule['plus']} = {want}")
    return errs


def engine_errors(engine: str, ec, trtllm_fields: dict | None = None) -> list[str]:
    """Everything the engine's source would refuse in one printed config."""
    schema = SCHEMAS[engine]
    if engine == "vllm":
        return mapping_errors(parse_vllm(ec.text), schema["fields"], schema["required"])
    if engine == "trtllm":
        fields = trtllm_fields if trtllm_fields is not None else schema["fields"]
        obj = parse_trtllm(ec.text, ec.data)
        return mapping_errors(obj, fields, schema["required"])
    values, errs = parse_flags(ec.text, schema["flags"])
    return errs + flag_errors(values, schema["flags"], schema["required"])


def trtllm_release_fields() -> dict[str, dict]:
    """DecodingBaseConfig/DSparkDecodingConfig fields read from llm_args.py, and the confidence
    fields the 1.4.0rc4 signature adds."""
    s = SCHEMAS["trtllm"]
    return {**s["fields"], **s["fields_in_1_4_0rc4_signature_only"]}


def all_errors(engine: str, rows, **kw) -> list[str]:
    out = []
    for block, cand in rows:
        ec = render_row(engine, block, cand)
        out += [f"[block {block}, {cand.label}] {e}" for e in engine_errors(engine, ec, **kw)]
    return out


# ------------------------------------------------------------------ the tests
def test_schema_names_the_source_it_was_read_from():
    for engine in ENGINES:
        s = SCHEMAS[engine]
        assert s["sources"], engine
        for src in s["sources"]:
            assert re.fullmatch(r"[0-9a-f]{40}", src["commit"]), src
            assert "/" in src["repo"] and src["path"] and src["read"], src
        table = s.get("fields") or s.get("flags")
        assert set(s["required"]) <= set(table), engine


@pytest.mark.parametrize("engine", ENGINES)
def test_grid_covers_every_knob_value_tune_can_print(engine):
    """The renderings checked below include the default row, speculation off and every value
    of every knob the grid searches (so a value only some rows print is not missed)."""
    rows = grid(engine)
    roles = {c.role for _, c in rows}
    assert {"no-spec", "default", "grid"} <= roles
    seen: dict[str, set] = {}
    for _, c in rows:
        for k, v in c.knobs:
            seen.setdefault(k, set()).add(v)
    assert set(range(1, max(BLOCKS) + 1)) <= seen[LENS_KNOB[engine]]
    if engine == "vllm":
        assert seen["enable_adaptive_verification"] == {False, True}
    if engine == "trtllm":
        assert seen["enable_confidence_scheduling"] == {False, True}
        assert set(DEFAULT_GAINS) | set(EXTRA_GAINS) == seen["confidence_min_predicted_gain"]
        assert any(set(s) == set(TUNED_SCHEDULES[0]) for s in seen["draft_len_schedule"])
    if engine == "llama":
        assert set(DEFAULT_P_MINS) | set(EXTRA_P_MINS) == seen["spec_draft_p_min"]


@pytest.mark.parametrize("engine", ["vllm", "sglang", "llama"])
def test_every_printed_config_is_accepted_by_the_engine_source(engine):
    rows = speculating(engine)
    assert len(rows) > 20
    assert all_errors(engine, rows) == []


def test_trtllm_config_is_accepted_by_the_1_4_0rc4_dspark_decoding_config():
    """Against llm_args.py's fields plus the confidence fields of the 1.4.0rc4 signature."""
    rows = speculating("trtllm")
    assert any(c.knob_dict().get("enable_confidence_scheduling") for _, c in rows)
    assert all_errors("trtllm", rows, trtllm_fields=trtllm_release_fields()) == []


def test_trtllm_rows_without_confidence_scheduling_load_on_the_source_and_say_the_release():
    """llm_args.py (the source read) has no confidence field: a row without confidence
    scheduling prints none, so it loads on any release with DSpark; a row with it is for
    1.4.0rc4 or newer and says so in its notes."""
    rows = speculating("trtllm")
    plain = [(b, c) for b, c in rows if not c.knob_dict().get("enable_confidence_scheduling")]
    conf = [(b, c) for b, c in rows if c.knob_dict().get("enable_confidence_scheduling")]
    assert plain and conf
    assert all_errors("trtllm", plain) == []
    for block, cand in conf:
        ec = render_row("trtllm", block, cand)
        assert ec.data["enable_confidence_scheduling"] is True
        assert any("1.4.0rc4" in n for n in ec.notes), cand.label


@pytest.mark.parametrize(
    ("best", "expected"),
    [
        ({1: 3, 16: 7}, ((16, 7),)),
        ({1: 0, 8: 5}, ((8, 5),)),
        ({1: 7, 8: 3, 64: 5}, ((1, 7), (64, 5))),
    ],
)
def test_trtllm_tuned_schedule_that_grows_with_load_is_accepted(best, expected):
    """tune's own path (tune.py: tuned_schedule, then schedule_candidate) when the best fixed
    length at a lower load is below that at a higher one (0: no speculation): the schedule is
    made non-increasing (the smaller batches raised), which TensorRT-LLM's validator takes."""

    def load(c: int, k: int) -> SimpleNamespace:  # a LoadResult as tuned_schedule reads it
        rows = [{"policy": f"static:{j}" if j else "ar", "objective": float(j == k),
                 "sla_met": True} for j in sorted({0, *best.values()})]  # fmt: skip
        return SimpleNamespace(load=SimpleNamespace(value=c), rows=rows)

    sched = tuned_schedule([load(c, k) for c, k in best.items()], "throughput")
    assert sched == expected
    cand = schedule_candidate(sched, "tuned across these loads")
    ec = render("trtllm", cand.knob_dict(), block=7)
    assert engine_errors("trtllm", ec, trtllm_fields=trtllm_release_fields()) == []


@pytest.mark.skipif(yaml is None, reason="needs PyYAML, TensorRT-LLM's YAML reader")
@pytest.mark.parametrize("gain", [1e-5, 1e16, 0.04, 0.0, 2.5e-7])
def test_trtllm_gain_reads_back_as_the_yaml_float_tune_scored(gain):
    knobs = {"max_draft_len": 7, "enable_confidence_scheduling": True,
             "confidence_min_predicted_gain": gain}  # fmt: skip
    ec = render("trtllm", knobs, block=7)
    assert engine_errors("trtllm", ec, trtllm_fields=trtllm_release_fields()) == []
    value = yaml.safe_load(ec.text)["speculative_config"]["confidence_min_predicted_gain"]
    assert isinstance(value, float) and value == gain


def test_llama_p_min_is_printed_unrounded():
    ec = render("llama", {"spec_draft_n_max": 7, "spec_draft_p_min": 0.1234567})
    argv = shlex.split(ec.text)
    assert float(argv[argv.index("--spec-draft-p-min") + 1]) == 0.1234567


@pytest.mark.parametrize("engine", ENGINES)
def test_speculation_off_prints_no_engine_config(engine):
    """No speculation is the engine run without its speculative flags: the text is a note the
    engine never reads (a parenthesis, or a YAML comment that loads as nothing)."""
    off = [c for _, c in grid(engine) if c.role == "no-spec"]
    assert off
    for c in off:
        ec = render(engine, c.knob_dict())
        assert ec.data == {}
        if engine == "trtllm":
            assert ec.text.startswith("# ")
            if yaml is not None:
                assert yaml.safe_load(ec.text) is None
        else:
            assert (
                ec.text.startswith("(") and ec.text.endswith(")") and "speculation off" in ec.text
            )


@pytest.mark.parametrize("engine", ENGINES)
def test_the_engine_parses_the_tuned_values(engine):
    """What the engine reads back is the setting tune scored (no rounding, no renaming)."""
    schema = SCHEMAS[engine]
    for block, cand in speculating(engine):
        knobs = cand.knob_dict()
        ec = render_row(engine, block, cand)
        if engine == "vllm":
            got = parse_vllm(ec.text)
            assert got["method"] == "dspark"
            want = {k: knobs[k] for k in ("num_speculative_tokens", "enable_adaptive_verification")}
            assert {k: got[k] for k in want} == want
        elif engine == "trtllm":
            got = parse_trtllm(ec.text, ec.data)
            assert got["decoding_type"] == "DSpark"
            for k, v in knobs.items():
                # confidence scheduling off is the field's default: not printed (see above)
                default = k == "enable_confidence_scheduling" and v is False
                want = dict(v) if k == "draft_len_schedule" else v
                assert got.get(k, False if default else None) == want, (cand.label, k)
        elif engine == "sglang":
            got, _ = parse_flags(ec.text, schema["flags"])
            g = knobs["speculative_dspark_block_size"]
            assert got["--speculative-algorithm"] == "DSPARK"
            assert int(got["--speculative-dspark-block-size"]) == g
            assert (
                int(got["--speculative-num-draft-tokens"]) == knobs["speculative_num_draft_tokens"]
            )
        else:
            got, _ = parse_flags(ec.text, schema["flags"])
            assert got["--spec-type"] == "draft-dspark"
            assert int(got["--spec-draft-n-max"]) == knobs["spec_draft_n_max"]
            assert float(got["--spec-draft-p-min"]) == knobs["spec_draft_p_min"]


DRAFTERS = ["/models/DSpark Qwen3-8B", "yes", "1.5", "a: b", "~", "it's"]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("drafter", DRAFTERS)
def test_a_drafter_path_reaches_the_engine_unchanged(engine, drafter):
    """``--drafter`` paths a shell or YAML would misread (spaces, quotes, YAML keywords and
    numbers) still parse as the path, under the field the source declares."""
    block, cand = next((b, c) for b, c in grid(engine) if c.role == "default")
    ec = render_row(engine, block, cand, drafter=drafter)
    assert engine_errors(engine, ec, trtllm_fields=trtllm_release_fields()) == []
    if engine == "vllm":
        assert parse_vllm(ec.text)["model"] == drafter
    elif engine == "trtllm":
        assert parse_trtllm(ec.text, ec.data)["speculative_model"] == drafter
    else:
        flag = {"sglang": "--speculative-draft-model-path", "llama": "--spec-draft-model"}[engine]
        assert parse_flags(ec.text, SCHEMAS[engine]["flags"])[0][flag] == drafter


# ------------------------------------------------------------------ the checker has teeth
BAD = {
    "vllm": [
        '--speculative-config \'{"method": "dspark2", "num_speculative_tokens": 7}\'',
        '--speculative-config \'{"method": "dspark", "num_speculative_tokens": 0}\'',
        '--speculative-config \'{"method": "dspark"}\'',
        '--speculative-config \'{"method": "eagle3", "num_speculative_tokens": 3, '
        '"enable_adaptive_verification": true}\'',
        '--speculative-config \'{"method": "dspark", "num_speculative_tokens": 7, '
        '"adaptive_verification": true}\'',
    ],
    "trtllm": [
        "speculative_config:\n  decoding_type: Dspark\n  max_draft_len: 7",
        "speculative_config:\n  decoding_type: DSpark\n  max_draft_len: 7\n  draft_len: 3",
        "speculative_config:\n  decoding_type: DSpark\n  max_draft_len: 7\n"
        "  draft_len_schedule:\n    1: 7\n    8: 9",
        "speculative_config:\n  decoding_type: DSpark\n  max_draft_len: -1",
    ],
    "sglang": [
        "--speculative-algorithm DSPARK --speculative-draft-model-path d "
        "--speculative-dspark-block-size 7 --speculative-num-draft-tokens 7",
        "--speculative-algorithm DSpark2 --speculative-draft-model-path d "
        "--speculative-dspark-block-size 7",
        "--speculative-algorithm DSPARK --speculative-draft-model-path d "
        "--speculative-dspark-gamma 7",
        "--speculative-algorithm DSPARK --speculative-draft-model-path d "
        "--speculative-dspark-block-size 0",
    ],
    "llama": [
        "-md d.gguf --spec-type dspark --spec-draft-n-max 7",
        "-md d.gguf --spec-type draft-dspark --spec-draft-n-max 7.5",
        "-md d.gguf --spec-type draft-dspark --spec-draft-max 7",
        "-md d.gguf --spec-type draft-dspark --spec-draft-p-min high",
        "-md d.gguf --spec-draft-n-max 7",
    ],
}


@pytest.mark.parametrize("engine", ENGINES)
def test_the_checker_refuses_what_the_source_refuses(engine):
    """Misspelt names, wrong literals, wrong types and broken cross-field rules are caught, so
    an empty error list above means something."""

    class Printed:
        def __init__(self, text: str):
            self.text = text
            self.data = yaml.safe_load(text)["speculative_config"] if engine == "trtllm" else {}

    if engine == "trtllm" and yaml is None:
        pytest.skip("needs PyYAML")
    for text in BAD[engine]:
        assert engine_errors(engine, Printed(text)), text
