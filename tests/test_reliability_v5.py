"""Reliability v5: each class of bad input a hostile tester found, fixed at its root and checked
here through the real entry points (``specsim.cli.main``, ``notebooks/execute.py`` and the
``scripts/`` a user runs, as subprocesses): a notebook that is not one, fails or kills its
kernel; a script's unknown names, empty lists and missing files; a report block past its
profile; a progress period of 0; an audited server that accepts and never answers; a URL that
is not one; a near-tie margin wide enough to pass a lossy server; a trace holding bytes that
are not UTF-8. Every refusal is one line and exit 2 (a notebook that fails: exit 1), with no
traceback, nothing half-written and no empty folder left."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_fuzz_cli import run
from test_real_deployments import TINY, _toml
from test_reliability_v4 import _refused

ROOT = Path(__file__).resolve().parent.parent
EXECUTE = ROOT / "notebooks" / "execute.py"


def _script(path: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=timeout)  # fmt: skip


def _error_lines(err: str, prog: str) -> list[str]:
    assert "Traceback" not in err, err
    return [ln for ln in err.splitlines() if ln.startswith(f"{prog}: error:")]


def _one_line(done: subprocess.CompletedProcess, prog: str, code: int, *says: str) -> str:
    assert done.returncode == code, (done.returncode, done.stderr)
    lines = _error_lines(done.stderr, prog)
    assert len(lines) == 1, done.stderr
    for word in says:
        assert word in lines[0], (word, lines[0])
    return lines[0]


# ---- 1. notebooks/execute.py: bad notebooks, failing cells, dead kernels, outputs ----------


def _book(path: Path, *cells: str) -> Path:
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nbformat.write(nb, path)
    return path


@pytest.mark.slow
@pytest.mark.parametrize(
    "content, says",
    [("", "is empty"), ("hello {", "not JSON"), ("[1, 2]", "its JSON is a list"),
     ('{"nbformat": 4, "nbformat_minor": 5, "metadata": {}}', "not a valid notebook"),
     (b"\xff\xfe{", "is not UTF-8")],
)  # fmt: skip
def test_a_file_that_is_not_a_notebook_is_one_line_and_nothing_is_made(content, says, tmp_path):
    pytest.importorskip("nbclient")
    src = tmp_path / "bad.ipynb"
    if isinstance(content, bytes):
        src.write_bytes(content)
    else:
        src.write_text(content)
    out = tmp_path / "copies"
    _one_line(_script(EXECUTE, str(src), "--out", str(out)), "execute.py", 2, str(src), says)
    assert not out.exists()  # no empty output folder


@pytest.mark.slow
def test_outputs_that_cannot_be_written_are_refused_before_any_kernel(tmp_path):
    pytest.importorskip("nbclient")
    src = _book(tmp_path / "tiny.ipynb", "print(1)")
    a_file = tmp_path / "a_file"
    a_file.write_text("mine")
    _one_line(_script(EXECUTE, str(src), "--out", str(a_file)), "execute.py", 2, "is a file")
    _one_line(_script(EXECUTE, str(src), "--out", str(a_file / "x")), "execute.py", 2,
              "is a file, not a folder")  # fmt: skip
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        _one_line(_script(EXECUTE, str(src), "--out", str(ro / "copies")), "execute.py", 2,
                  "read-only")  # fmt: skip
        assert not any(ro.iterdir())
    finally:
        ro.chmod(0o755)
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "tiny.ipynb").write_text("a copy the user made read-only")
    (kept / "tiny.ipynb").chmod(0o444)
    _one_line(_script(EXECUTE, str(src), "--out", str(kept)), "execute.py", 2, "read-only")
    assert (kept / "tiny.ipynb").read_text() == "a copy the user made read-only"
    before = src.read_bytes()
    src.chmod(0o444)
    try:
        _one_line(_script(EXECUTE, str(src), "--in-place"), "execute.py", 2, "read-only",
                  "--out DIR")  # fmt: skip
    finally:
        src.chmod(0o644)
    assert src.read_bytes() == before and a_file.read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "kept", "ro", "tiny.ipynb"]
    assert sorted(p.name for p in kept.iterdir()) == ["tiny.ipynb"]  # no temporary beside it


@pytest.mark.slow
def test_a_cell_that_raises_is_named_by_its_cell_and_nothing_is_written(tmp_path):
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    src = _book(tmp_path / "raises.ipynb", "x = 1", "print('hi')\n1 / 0")
    out = tmp_path / "copies"
    says = ("raises.ipynb", "cell 2 of 2", "ZeroDivisionError: division by zero")
    line = _one_line(_script(EXECUTE, str(src), "--out", str(out)), "execute.py", 1, *says)
    assert "\x1b[" not in line  # the exception's last line, not its coloured traceback
    assert not out.exists()


@pytest.mark.slow
def test_a_notebook_that_kills_its_kernel_is_one_line(tmp_path):
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    src = _book(tmp_path / "dies.ipynb", "import os\nos._exit(1)")
    out = tmp_path / "copies"
    _one_line(_script(EXECUTE, str(src), "--out", str(out)), "execute.py", 1, "dies.ipynb",
              "kernel died", "cell 1 of 1")  # fmt: skip
    assert not out.exists()


@pytest.mark.slow
def test_a_run_prints_no_unencrypted_tcp_warning(tmp_path):
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    src = _book(tmp_path / "tiny.ipynb", "print(6 * 7)")
    done = _script(EXECUTE, str(src), "--out", str(tmp_path / "copies"))
    assert done.returncode == 0, done.stderr
    assert "without encryption" not in done.stderr and "TCP" not in done.stderr, done.stderr
    assert (tmp_path / "copies" / "tiny.ipynb").is_file()
    assert not list((tmp_path / "copies").glob(".*"))  # no temporary left beside it


# ---- 2. scripts/: unknown names, empty lists, missing files, unbounded counts --------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "script, args, says",
    [("calibrate_profile_build.py", ["--arms", "k99"], "no arm 'k99'"),
     ("calibrate_profile_build.py", ["--arms", ""], "--arms is empty"),
     ("calibrate_profile_build.py", ["--arms", "k1,,k3"], "empty item"),
     ("make_train_prompts.py", ["--code", "5000"], "outside 1..2,700"),  # drew forever
     ("make_train_prompts.py", ["--math", "0"], "--math"),
     ("llama_dspark_parity.py", ["--out", "{tmp}/p", "--per-set", "0"], "--per-set"),
     ("llama_dspark_parity.py", ["--out", "{tmp}/p", "--drafter", "ngram"], "no weights"),
     ("derive_operator_tables.py", ["{tmp}"], "no Vidur profiling data"),
     ("plot_learning_curve.py", ["{tmp}", "--out", "{tmp}/c.png"], "training_report.json"),
     ("plot_learning_curve.py", ["{tmp}", "--out", "{tmp}/c.png", "--names", ""], "--names"),
     ("read_vllm_fig3.py", ["{tmp}/absent.svg", "--out", "{tmp}/f.csv"], "cannot read"),
     ("read_vllm_fig3.py", ["{tmp}/empty.svg", "--out", "{tmp}/f.csv"], "tick marks"),
     ("score_real_deployments.py", ["{tmp}"], "predictions.csv does not exist"),
     ("make_eval_prompts.py", ["--out", "{tmp}/x.txt"], "must end in .jsonl")],
)  # fmt: skip
def test_a_script_refuses_bad_input_in_one_line_and_writes_nothing(script, args, says, tmp_path):
    (tmp_path / "empty.svg").write_text("<svg></svg>")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in args]
    _one_line(_script(ROOT / "scripts" / script, *argv), script, 2, says)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.svg"]


# ---- 3. report configs: a block no longer than its acceptance profile ----------------------


@pytest.mark.parametrize("block", [1_000_000, 8, 0])
def test_a_dspark_block_past_its_profile_is_refused(block, tmp_path):
    folder = tmp_path / "rd"
    folder.mkdir()
    (folder / "config.toml").write_text(_toml({**TINY, "paper_dspark_block": block}))
    _refused(["report", "rd", "--root", str(tmp_path)],
             f"'paper_dspark_block' is {block}; give a whole number from 1 to 7")  # fmt: skip
    assert sorted(p.name for p in folder.iterdir()) == ["config.toml"]


# ---- 4. SPECSIM_PROGRESS_EVERY: a period > 0, or a flood ------------------------------------


@pytest.mark.parametrize("value", ["0", "-1", "-0", "inf", "nan", " "])
def test_a_progress_period_that_is_not_positive_is_refused(value, monkeypatch):
    monkeypatch.setenv("SPECSIM_PROGRESS_EVERY", value)
    _refused(["traces", "info", "chat"], "SPECSIM_PROGRESS_EVERY", "> 0", "SPECSIM_PROGRESS=0")


def test_a_small_positive_progress_period_still_logs(monkeypatch, capsys):
    from specsim.progress import Progress

    monkeypatch.setenv("SPECSIM_PROGRESS", "lines")
    monkeypatch.setenv("SPECSIM_PROGRESS_EVERY", "1e-9")
    with Progress(2, "x") as bar:
        bar.update(2)
    assert "specsim: x 2/2" in capsys.readouterr().err


# ---- 5. an audited server that accepts the connection and never answers ---------------------


@contextmanager
def silent_server() -> Iterator[str]:
    """A socket that accepts every connection and never sends a byte."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        sock.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(sock.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        for c in held:
            c.close()
        sock.close()


@contextmanager
def answering_server() -> Iterator[str]:
    """An HTTP server that answers every GET (200, empty JSON): up, whatever it is."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.slow
@pytest.mark.parametrize("hung", ["server", "reference"])
@pytest.mark.parametrize("greedy", [False, True])
def test_a_server_that_never_answers_is_given_up_on_in_a_stated_time(hung, greedy):
    extra = ["--temperature", "0", "--near-tie", "0.5"] if greedy else []
    with silent_server() as silent, answering_server() as up:
        server, reference = (silent, up) if hung == "server" else (up, silent)
        t0 = time.monotonic()
        says = (f"the {hung} at {silent}", "within 0.5 s (--first-byte-timeout-s)")
        err = _refused(["check-lossless", "--server", server, "--reference", reference,
                        "--first-byte-timeout-s", "0.5", *extra], *says)  # fmt: skip
        assert time.monotonic() - t0 < 20, err


def test_the_first_byte_timeout_is_checked_as_a_flag():
    _refused(["check-lossless", "--server", "http://127.0.0.1:8", "--reference",
              "http://127.0.0.1:9", "--first-byte-timeout-s", "0"],
             "--first-byte-timeout-s must be seconds")  # fmt: skip


# ---- 6. one URL rule for --server and --reference -------------------------------------------


@pytest.mark.parametrize("flag", ["--server", "--reference"])
@pytest.mark.parametrize(
    "url", ["http://[::1", "http://[zz]:80", "http://h:999999", "http://h:8?x"]
)
def test_a_url_that_is_not_one_is_one_line_on_either_flag(flag, url):
    urls = {"--server": "http://127.0.0.1:8", "--reference": "http://127.0.0.1:9", flag: url}
    _refused(["check-lossless", "--server", urls["--server"], "--reference",
              urls["--reference"]], flag)  # fmt: skip


# ---- 7. --near-tie: a numerics margin, not a licence ----------------------------------------


@pytest.mark.parametrize("value", ["1000000", "1.5", "inf", "nan", "0", "-0.1"])
def test_a_near_tie_past_one_nat_is_refused(value):
    _refused(["check-lossless", "--server", "http://127.0.0.1:8", "--reference",
              "http://127.0.0.1:9", "--temperature", "0", "--near-tie", value],
             "--near-tie", "(0, 1]")  # fmt: skip


def test_a_near_tie_within_range_is_taken():
    from specsim.serve.audit.config import MAX_NEAR_TIE, AuditConfig

    cfg = AuditConfig(server="http://127.0.0.1:8", reference="http://127.0.0.1:9",
                      temperature=0.0, near_tie=MAX_NEAR_TIE)  # fmt: skip
    assert cfg.near_tie == 1.0


# ---- 8. traces: text that is not UTF-8 --------------------------------------------------------


def _shipped_table() -> pa.Table:
    from specsim.trace.io import read_trace, trace_to_table

    return trace_to_table(read_trace("chat"))


def _not_utf8_category(table: pa.Table) -> pa.Table:
    raw = pa.array([b"\xff\xfe"] * table.num_rows, pa.binary())
    text = pa.Array.from_buffers(pa.string(), len(raw), raw.buffers())  # no validation
    return table.set_column(table.schema.get_field_index("category"), "category", text)


def _meta(table: pa.Table, key: bytes, value: bytes) -> pa.Table:
    return table.replace_schema_metadata({**table.schema.metadata, key: value})


@pytest.mark.parametrize(
    "make, says",
    [(_not_utf8_category, "row 0: column 'category' holds bytes that are not UTF-8"),
     (lambda t: _meta(t, b"drafter", b"dspark\xff"), "metadata key 'drafter'"),
     (lambda t: _meta(t, b"\xffkey", b"x"), "holds bytes that are not UTF-8")],
)  # fmt: skip
@pytest.mark.parametrize("argv", [["traces", "validate"], ["traces", "info"],
                                  ["replay", "--requests", "4", "--concurrency", "1"]])  # fmt: skip
def test_a_trace_with_text_that_is_not_utf8_is_one_line_naming_the_file(make, says, argv,
                                                                          tmp_path):  # fmt: skip
    path = tmp_path / "bad.parquet"
    pq.write_table(make(_shipped_table()), path)
    _refused([*argv[:2], str(path), *argv[2:]] if argv[0] == "traces" else
             [argv[0], str(path), *argv[1:]], str(path), says)  # fmt: skip


def test_a_trace_whose_file_name_is_not_utf8_is_read(tmp_path):
    name = tmp_path / "t\udcff.parquet"  # byte 0xff in the name, as a Linux name may hold
    try:
        with open(name, "wb") as f:
            pq.write_table(_shipped_table(), f)
    except (UnicodeEncodeError, OSError):
        pytest.skip("this file system cannot hold a name that is not UTF-8")
    rc, out, err = run(["traces", "info", str(name)])
    assert rc == 0, err
    assert "chat" in out


def test_a_file_that_is_not_parquet_with_bytes_that_are_not_utf8_is_one_line(tmp_path):
    path = tmp_path / "x.parquet"
    path.write_bytes(b"\xff\xfe\x00 not parquet \x80\x81" * 20)
    _refused(["traces", "validate", str(path)], str(path), "not a readable Parquet file")
