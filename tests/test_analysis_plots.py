"""Figures from a real sweep and a real trace: they render, carry units, labels and legends,
keep one colour per policy, are byte-stable, and the calibration plot sees what STS fixes."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.colors as mcolors  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from specsim.analysis.figures import figure, save_figure  # noqa: E402
from specsim.analysis.palette import policy_order, policy_style  # noqa: E402
from specsim.analysis.plots import (  # noqa: E402
    calibration_table,
    plot_calibration,
    plot_load,
    plot_pareto,
    plot_sla,
)
from specsim.analysis.sweep import sweep  # noqa: E402
from specsim.cli import main  # noqa: E402
from specsim.errors import SpecsimError  # noqa: E402
from specsim.trace.io import write_trace  # noqa: E402
from specsim.trace.synth import synth_trace  # noqa: E402

POLICIES = ["mtp1", "hw-aware", "zos", "ar"]


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory) -> str:
    # over-confident (logit x 1.8) so calibration has something to fix
    t = synth_trace(
        n_requests=240, accept_profile=[0.8, 0.7, 0.65, 0.6, 0.6], calibration=1.8, seed=5
    )
    p = tmp_path_factory.mktemp("tr") / "overconfident.parquet"
    write_trace(t, p)
    return str(p)


@pytest.fixture(scope="module")
def results(trace_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("res") / "results.parquet"
    sweep(trace_path, POLICIES, concurrency=[1, 4, 16, 64], requests=60, workers=1, out=out)
    return out


def _lines_by_label(ax):
    return {ln.get_label(): ln for ln in ax.get_lines() if not ln.get_label().startswith("_")}


@pytest.mark.slow
def test_pareto_one_curve_per_policy_in_its_colour(results):
    import pandas as pd

    table = pd.read_parquet(results)
    fig, ax = plt.subplots()
    plot_pareto(table, ax)
    lines = _lines_by_label(ax)
    assert set(lines) == set(POLICIES)
    for pol, ln in lines.items():
        assert mcolors.same_color(ln.get_color(), policy_style(pol).color)
        assert len(ln.get_xdata()) == 4  # one point per load
    assert "tok/s/user" in ax.get_xlabel() and "tok/s" in ax.get_ylabel()
    assert [t.get_text() for t in ax.get_legend().get_texts()] == policy_order(POLICIES)
    plt.close(fig)


def test_sla_bars_are_labelled_with_values_and_gains(results):
    import pandas as pd

    table = pd.read_parquet(results)
    fig, ax = plt.subplots()
    plot_sla(table, [50.0, 100.0], ax, baseline="mtp1")
    texts = [t.get_text() for t in ax.texts]
    assert any("%" in t for t in texts), "gains over the baseline are printed on the bars"
    bars = [p for p in ax.patches]
    assert len(bars) == 2 * len(POLICIES)
    colours = {mcolors.to_hex(b.get_facecolor()).upper() for b in bars}
    assert colours == {policy_style(p).color.upper() for p in POLICIES}
    assert "tok/s/user" in ax.get_xlabel() and "(tok/s)" in ax.get_ylabel()
    plt.close(fig)


def test_load_panels_have_units_and_a_legend(results):
    import pandas as pd

    table = pd.read_parquet(results)
    fig, axes = plt.subplots(2, 2)
    plot_load(table, axes)
    labels = [ax.get_ylabel() for ax in axes.ravel()]
    assert any("(tok)" in s for s in labels) and sum("(ms)" in s for s in labels) == 2
    assert all("concurrent requests" in ax.get_xlabel() for ax in axes.ravel())
    assert axes.ravel()[1].get_legend().get_title().get_text() == "policy"  # beside the panel
    plt.close(fig)


def test_calibration_sts_lowers_ece_on_an_overconfident_trace(trace_path):
    from specsim.trace.io import read_trace

    t = read_trace(trace_path)
    tab = calibration_table(t)
    assert len(tab) == t.block_size
    assert tab["ece_sts"].mean() < 0.5 * tab["ece_raw"].mean()
    fig, axes = plt.subplots(1, 2)
    plot_calibration(t, axes)
    for ax in axes:
        assert "ECE" in ax.get_title()
        assert len(_lines_by_label(ax)) == t.block_size + 1  # a_1..a_gamma and the diagonal
    plt.close(fig)


def test_calibration_table_mutant_a_calibrated_trace_has_little_to_fix(tmp_path):
    """Teeth for the test above: on a calibrated trace raw ECE is already small."""
    t = synth_trace(n_requests=240, accept_profile=[0.8, 0.7, 0.65, 0.6, 0.6], seed=5)
    tab = calibration_table(t)
    assert tab["ece_raw"].mean() < 0.03


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["pareto", "sla", "load"])
def test_cli_plot_renders_png_and_is_byte_stable(results, tmp_path, kind, capsys):
    extra = ["--sla", "50,100"] if kind == "sla" else []
    a, b = tmp_path / "a.png", tmp_path / "b.png"
    assert main(["plot", str(results), "--kind", kind, "--out", str(a), *extra]) == 0
    assert main(["plot", str(results), "--kind", kind, "--out", str(b), *extra]) == 0
    assert a.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert a.read_bytes() == b.read_bytes()
    # never overwrite without --force
    assert main(["plot", str(results), "--kind", kind, "--out", str(a), *extra]) == 2
    assert "--force" in capsys.readouterr().err
    assert main(["plot", str(results), "--kind", kind, "--out", str(a), "--force", *extra]) == 0


@pytest.mark.slow
def test_cli_calibration_from_a_trace_as_svg_and_pdf(trace_path, tmp_path):
    for suffix, magic in ((".svg", b"<?xml"), (".pdf", b"%PDF")):
        out = tmp_path / f"cal{suffix}"
        assert main(["plot", trace_path, "--kind", "calibration", "--out", str(out)]) == 0
        assert out.read_bytes().startswith(magic)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["{r}", "--kind", "sla"], "--sla"),
        (["{t}", "--kind", "pareto"], "not a sweep table"),
        (["{r}", "--kind", "pareto", "--out", "x.gif"], ".png, .svg or .pdf"),
        (["missing.parquet", "--kind", "pareto"], "does not exist"),
        (["{r}", "--kind", "pareto", "--trace", "nope"], "not in the table"),
    ],
)
def test_cli_plot_errors_are_one_line(results, trace_path, tmp_path, capsys, argv, needle):
    argv = [a.replace("{r}", str(results)).replace("{t}", trace_path) for a in argv]
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "f.png")]
    else:
        i = argv.index("--out")
        argv[i + 1] = str(tmp_path / argv[i + 1])
    assert main(["plot", *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


@pytest.mark.slow
def test_figure_with_several_traces_has_a_panel_each(trace_path, tmp_path):
    other = tmp_path / "other.parquet"
    write_trace(synth_trace(n_requests=40, accept_profile=[0.6, 0.5, 0.4], seed=1), other)
    table = sweep(
        [trace_path, str(other)], ["mtp1", "zos"], concurrency=[1, 8], requests=30, workers=1
    )
    fig = figure("pareto", table)
    assert len(fig.axes) == 2
    assert {ax.get_title() for ax in fig.axes} == {"trace overconfident", "trace other"}
    with pytest.raises(SpecsimError, match="several traces"):
        plot_pareto(table)
    path = save_figure(fig, tmp_path / "two.png")
    assert path.stat().st_size > 10_000
    plt.close(fig)
    assert np.isfinite(table["throughput_tok_s"]).all()


def test_ratio_figure_names_rows_on_the_first_column_only() -> None:
    # long trace names used to run into the panel on their left (reports' auto.png)
    import pandas as pd

    from specsim.analysis.figures import ratio_figure

    rows = [
        {"profile": p, "trace": t, "load": c, "ratio": 1.0 + 0.01 * i}
        for i, (p, t, c) in enumerate(
            (p, t, c) for p in ("a", "b", "c") for t in ("chat", "synthetic-code") for c in (1, 4)
        )
    ]
    fig = ratio_figure(pd.DataFrame(rows), label="x / best")
    fig.canvas.draw()
    panels = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"][:4]
    shown = [any(t.get_visible() and t.get_text() for t in ax.get_yticklabels()) for ax in panels]
    assert shown[:3] == [True, False, True]  # columns 0, 1, 0
    assert not panels[3].get_visible()  # 3 profiles in a 2 x 2 grid
    assert [t.get_text() for t in panels[0].get_yticklabels()] == ["chat", "synthetic-code"]
    plt.close(fig)


def test_auto_ratios_compare_auto_with_the_best_reference() -> None:
    import pandas as pd

    from specsim.analysis.reports.sul_auto import auto_ratios

    tput = {"mtp1": 100.0, "zos": 120.0, "auto": 118.0, "oracle": 130.0}
    both = pd.DataFrame(
        [{"profile": "p", "trace": "t", "concurrency": 4, "policy": k, "steady_throughput_tok_s": v}
         for k, v in tput.items()]
    )  # fmt: skip
    r = auto_ratios(both, ["mtp1", "zos"], "auto").iloc[0]
    assert r["best built-in"] == "zos" and r["load"] == 4
    assert np.isclose(r["auto / best"], 118 / 120) and np.isclose(r["auto / oracle"], 118 / 130)


def test_every_built_in_family_has_its_own_colour_and_the_lossy_one_says_so():
    from specsim.analysis.palette import _FAMILY, policy_label

    aliases = {"auto": "calibrated-zos"}  # one policy under two names
    report_variants = {"zos-serial", "fresh-overlapped"}  # ZOS report only, beside zos
    families = [f for f in _FAMILY if f not in aliases and f not in report_variants]
    colours = {f: mcolors.to_hex(policy_style(f).color) for f in families}
    clashes = [(a, b) for a in families for b in families if a < b and colours[a] == colours[b]]
    assert clashes == []
    assert policy_label("hw-aware-global") == "hw-aware-global (lossy)"
    assert policy_label("hw-aware") == "hw-aware" and policy_label("static:3") == "static:3"
    assert policy_label("zos-serial") == "zos-serial"  # not a registered policy: no claim
