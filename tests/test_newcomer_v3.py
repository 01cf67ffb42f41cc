"""What a newcomer tripped on (third round), each checked through the real CLI.

1. ``specsim traces info`` printed its three acceptance lengths on one line: now one labelled
   line each, with units, and ``--json`` keeps its keys.
2. ``specsim replay`` headlined per-GPU throughput where ``tune`` and the JSON give the
   deployment's: every throughput now says its basis, the deployment's first, per GPU beside.
3. ``specsim plot --kind pareto`` of twenty traces was a 2400 x 4965 px strip: a figure is now a
   grid of at most four columns on one page (long side <= 2400 px), with one legend.
4. A sweep printed a warning once per cell (540 lines over a report's progress): now once, with
   how many cells said it.
5. ``notebooks/execute.py`` rewrote the committed notebooks: it now writes copies to a folder
   (``notebooks/executed/``, git-ignored) unless ``--in-place``; ``pip install -e '.[notebook]'``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from specsim.cli import main

ROOT = Path(__file__).resolve().parents[1]


# --- 1. traces info -------------------------------------------------------------------------


def test_traces_info_puts_each_tau_on_its_own_labelled_line(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    assert main(["traces", "info", "traces/chat.parquet", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert main(["traces", "info", "traces/chat.parquet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    names = ("tau_replay", "tau_rows", "tokens_per_step")
    for name in names:
        [line] = [ln for ln in lines if ln.strip().startswith(name + " ")]
        assert f"{data[name]:.3f} tokens/step" in line, line  # its own value, with its unit
        assert not any(other in line for other in names if other != name), line
    assert any("bonus token included" in ln for ln in lines)
    [replay] = [ln for ln in lines if ln.strip().startswith("tau_replay")]
    lo, hi = data["tau_ci95"]
    assert f"95% CI [{lo:.3f}, {hi:.3f}]" in replay and "full-verification" in replay
    for name in ("conditional c_k", "survival a_k"):  # the two confidence scores apart too
        [line] = [ln for ln in lines if ln.strip().startswith(name)]
        assert "AUROC" in line and "ECE" in line
    # --json is unchanged: the same keys as before this change
    assert set(data) == {
        "file", "meta", "requests", "rows", "tokens", "gamma", "tau_replay", "tau_ci95",
        "tokens_per_step", "replay_steps", "tau_rows", "accept_rate", "conf_auroc", "conf_ece",
        "survival_auroc", "survival_ece", "categories", "per_position",
    }  # fmt: skip


# --- 2. replay's throughput basis -----------------------------------------------------------


def _replay(capsys, profile: str, *extra: str) -> tuple[dict, list[str]]:
    argv = ["replay", "synthetic-chat", "--policy", "zos", "--concurrency", "4"]
    argv += ["--requests", "32", "--profile", profile, *extra]
    assert main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert main(argv) == 0
    return data, capsys.readouterr().out.splitlines()


def _value(lines: list[str], label: str) -> tuple[float, str]:
    [line] = [ln for ln in lines if ln.startswith(label + ":")]
    rest = line[len(label) + 1 :]
    number = re.match(r"\s*([\d,.]+)", rest)
    assert number, line
    return float(number.group(1).replace(",", "")), rest


def test_replay_headlines_the_deployments_throughput_with_per_gpu_beside_it(capsys):
    data, lines = _replay(capsys, "v4-flash-8xh20")  # an 8-GPU node
    gpus = data["gpus"]
    assert gpus == 8
    for label, key in (
        ("Output token throughput (tok/s)", "throughput_tok_s"),
        ("Steady-state output throughput (tok/s)", "steady_throughput_tok_s"),
        ("Total token throughput (tok/s)", "total_throughput_tok_s"),
    ):
        value, rest = _value(lines, label)
        assert value == pytest.approx(data[key], abs=0.6)  # the JSON's, the deployment's
        assert "for the deployment (8 GPUs)" in rest, rest
        per = re.search(r"([\d,.]+) per GPU", rest)
        assert per and float(per.group(1).replace(",", "")) == pytest.approx(
            data[key] / gpus, abs=0.6
        )
    value, rest = _value(lines, "Request throughput (req/s)")
    assert value == pytest.approx(data["request_throughput"], abs=0.006)
    assert "for the deployment (8 GPUs)" in rest
    # every throughput the summary prints names its basis
    said = [ln for ln in lines if "throughput" in ln.lower() and ":" in ln]
    assert len(said) == 4 and all("for the deployment" in ln for ln in said), said


def test_replay_on_one_gpu_says_so_and_prints_no_per_gpu_copy(capsys):
    data, lines = _replay(capsys, "llama-3-8b-h100")
    value, rest = _value(lines, "Output token throughput (tok/s)")
    assert value == pytest.approx(data["throughput_tok_s"], abs=0.6)
    assert "for the deployment (1 GPU)" in rest and "per GPU" not in rest


def test_bench_says_its_throughput_is_the_whole_servers(capsys):
    # a real server is measured whole by its client: bench's throughputs say so too
    from test_broken_server import server

    with server("good") as url:
        argv = ["bench", "--url", url, "--prompts", "mt-bench[:3]", "--concurrency", "2",
                "--max-tokens", "4", "--timeout-s", "5"]  # fmt: skip
        assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    said = [ln for ln in lines if "throughput" in ln]
    assert len(said) == 3 and all("for the server (all its GPUs)" in ln for ln in said), lines


# --- 3. a figure fits a page ----------------------------------------------------------------


@pytest.fixture(scope="module")
def many_traces(tmp_path_factory) -> Path:
    """A sweep table of 21 traces (one small real sweep, its rows copied under 21 names): the
    shape of sweeping every shipped trace, in a second."""
    import pandas as pd

    folder = tmp_path_factory.mktemp("many")
    one = folder / "one.parquet"
    argv = ["sweep", str(ROOT / "traces" / "synthetic-chat.parquet"), "--policies", "mtp1,zos"]
    assert main([*argv, "--concurrency", "1,4", "--requests", "16", "--workers", "1",
                 "--out", str(one)]) == 0  # fmt: skip
    table = pd.read_parquet(one)
    names = [f"trace-{i:02d}" for i in range(21)]
    many = pd.concat([table.assign(trace=n) for n in names], ignore_index=True)
    out = folder / "many.parquet"
    many.to_parquet(out)
    return out


def _png_size(path: Path) -> tuple[int, int]:
    import matplotlib.image

    height, width = matplotlib.image.imread(path).shape[:2]
    return width, height


@pytest.mark.slow  # fast suite under 5 min: over 2.5 s alone (CI runs it)
@pytest.mark.parametrize(("kind", "extra"), [("pareto", []), ("sla", ["--sla", "100,200"])])
def test_a_plot_of_twenty_one_traces_fits_one_page(many_traces, tmp_path, kind, extra, capsys):
    out = tmp_path / f"{kind}.png"
    assert main(["plot", str(many_traces), "--kind", kind, "--out", str(out), *extra]) == 0
    width, height = _png_size(out)
    assert max(width, height) <= 2400 and min(width, height) >= 1000, (width, height)


@pytest.mark.slow
def test_the_pareto_grid_has_at_most_four_columns_and_one_legend(many_traces):
    import pandas as pd

    from specsim.analysis.figures import MAX_COLS, figure

    fig = figure("pareto", pd.read_parquet(many_traces))
    shown = [ax for ax in fig.axes if ax.get_visible()]
    assert len(shown) == 21
    columns = {round(ax.get_position().x0, 3) for ax in shown}
    assert len(columns) <= MAX_COLS == 4
    assert len(fig.legends) == 1 and not any(ax.get_legend() for ax in shown)
    w, h = fig.get_size_inches() * 150
    assert max(w, h) <= 2400 + 1


@pytest.mark.slow
def test_a_plot_too_big_for_a_page_is_one_line_naming_trace(many_traces, tmp_path, capsys):
    out = tmp_path / "load.png"
    assert main(["plot", str(many_traces), "--kind", "load", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--trace" in err[0] and "21 traces" in err[0], err
    assert not out.exists()
    few = ["--trace", "trace-00", "--trace", "trace-01"]
    assert main(["plot", str(many_traces), "--kind", "load", "--out", str(out), *few]) == 0
    assert max(_png_size(out)) <= 2400


# --- 4. a sweep's warnings, once each -------------------------------------------------------


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_sweep_says_each_warning_once_with_a_count(tmp_path, capsys, workers):
    # static:9 on 7-token blocks warns in every one of its cells; the CPU profile's "covers
    # token batches up to 128" (the report's 540 lines) in every cell that reaches more
    argv = ["sweep", str(ROOT / "traces" / "synthetic-chat.parquet"), "--profile",
            "smollm2-135m-cpu", "--policies", "static:9,mtp1", "--concurrency", "1,2",
            "--requests", "16", "--workers", workers,
            "--out", str(tmp_path / "w.parquet")]  # fmt: skip
    assert main(argv) == 0
    err = capsys.readouterr().err
    warned = [ln for ln in err.splitlines() if "warning:" in ln.lower()]
    static = [ln for ln in warned if "static:9 asks for 9 drafts" in ln]
    assert len(static) == 1 and "(said by 2 of 4 cells run)" in static[0], err
    assert len(warned) == len(set(warned)) <= 2, err  # each message once
    assert all(ln.startswith("specsim: warning: ") for ln in warned), err
    assert any("said by 4 of 4 cells run" in ln for ln in warned), err  # the profile's, once
    assert "UserWarning" not in err and "return _replay" not in err, err
    assert main(argv) == 0  # resumed: no cell runs, nothing to repeat
    assert "warning:" not in capsys.readouterr().err


# --- 5. notebooks ---------------------------------------------------------------------------


def test_the_notebook_extra_lists_what_execute_py_needs():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    names = {re.split(r"[<>=\[ ]", r)[0] for r in extras["notebook"]}
    assert {"jupyter", "nbclient", "nbformat", "ipykernel"} <= names


def _execute(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "notebooks" / "execute.py"), *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )


def _tiny(path: Path) -> Path:
    nbformat = pytest.importorskip("nbformat")
    book = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(6 * 7)")])
    nbformat.write(book, path)
    return path


def _printed(path: Path) -> str:
    import nbformat

    cell = nbformat.read(path, as_version=4).cells[0]
    return "".join(o.get("text", "") for o in cell.outputs)


@pytest.mark.slow  # a kernel start or two: several seconds on a loaded machine
def test_execute_py_writes_copies_and_leaves_the_notebook_alone(tmp_path):
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    src = _tiny(tmp_path / "tiny.ipynb")
    before = src.read_bytes()
    run = _execute(str(src), "--out", str(tmp_path / "copies"))
    assert run.returncode == 0, run.stderr
    assert src.read_bytes() == before  # the notebook itself is untouched
    assert _printed(tmp_path / "copies" / "tiny.ipynb") == "42\n"
    run = _execute(str(src), "--in-place")  # the maintainers' refresh
    assert run.returncode == 0, run.stderr
    assert _printed(src) == "42\n"


@pytest.mark.slow
def test_execute_py_defaults_to_a_git_ignored_folder_and_refuses_mistakes(tmp_path):
    pytest.importorskip("nbclient")
    helped = _execute("--help")
    assert helped.returncode == 0 and "notebooks/executed/" in helped.stdout
    assert "--in-place" in helped.stdout
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", "notebooks/executed/01-quickstart.ipynb"], cwd=ROOT
    )
    assert ignored.returncode == 0, "notebooks/executed/ must be git-ignored"
    src = _tiny(tmp_path / "tiny.ipynb")
    for args, needle in (
        ([str(src), "--out", str(tmp_path)], "--in-place"),  # the copy would replace it
        (["99-no-such"], "no notebook in notebooks/ starts with '99-no-such'"),
        ([str(tmp_path / "absent.ipynb")], "is not a notebook file"),
    ):
        run = _execute(*args)
        assert run.returncode == 2, run.stderr
        lines = run.stderr.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0], run.stderr
