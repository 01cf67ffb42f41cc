"""The real-server commands against servers that misbehave (issue: reliability v3).

A small HTTP server on 127.0.0.1, started and stopped by each test, misbehaves in one way:
refuses connections, answers HTTP 500, answers garbage, cuts the stream mid-event or at an
event boundary, stalls before the first byte or between events, trickles events past the
whole-request bound, streams no token, sends a line longer than any event. ``specsim bench``
must exit 1 with one line naming the first error and how many requests failed (never 0, never
a wait on a stalled server: small time bounds by flag), and ``check-lossless --server`` must
exit non-zero with one line. SIGINT and SIGTERM stop a bench that is waiting and keep what it
measured (exit 130 / 143, the table marked partial).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pandas as pd
import pytest

from specsim.cli import main
from specsim.serve.sse import MAX_LINE_CHARS

ROOT = Path(__file__).resolve().parent.parent
STALL_S = 5.0  # how long a stalling handler holds its request at most (released at teardown)
LIMIT_S = 20  # no test here may take longer, whatever the code under test does
POSTS: dict[str, dict[str, int]] = {}  # requests each running server has seen, by its URL


class TookTooLong(BaseException):
    """Raised in the test by SIGALRM: a BaseException, so no ``except Exception`` of the code
    under test (the CLI's, a failed request's) can swallow it."""


@pytest.fixture(autouse=True)
def bounded() -> Iterator[None]:
    """Every test is bounded in time: a hang fails the test instead of the suite."""

    def fire(signum: int, frame: object) -> None:
        raise TookTooLong(f"the test ran past {LIMIT_S} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, LIMIT_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _posts(url: str) -> int:
    return POSTS[url]["posts"]


def _event(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


TOKEN = _event({"content": "a", "tokens": [7]})
LAST = _event({"content": "", "stop": True, "timings": {"predicted_n": 4, "prompt_n": 3}})
GOOD = TOKEN * 4 + LAST


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # a stalled handler must not hold the test at teardown

    def handle_error(self, request, client_address) -> None:  # noqa: ANN001
        pass  # the client hung up on a misbehaving handler: expected here


@contextmanager
def server(kind: str) -> Iterator[str]:
    """A server on 127.0.0.1 whose ``/completion`` misbehaves as ``kind`` says (``reference``:
    a well-behaved llama-server stand-in for the audit's reference side)."""
    release = threading.Event()
    seen = {"posts": 0}

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # the body ends when the connection closes

        def log_message(self, *a) -> None:  # quiet
            pass

        def _json(self, obj: object) -> None:
            body = json.dumps(obj).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self._json({"total_slots": 2})

        def do_POST(self) -> None:  # noqa: N802
            n = int(self.headers.get("Content-Length", 0))
            body = json.loads(self.rfile.read(n) or b"{}")
            seen["posts"] += 1
            if self.path == "/tokenize":
                return self._json({"tokens": [1, 2, 3]})
            if self.path == "/apply-template":
                return self._json({"prompt": body["messages"][0]["content"]})
            self._completion(seen["posts"])

        def _stream_head(self, length: int | None = None) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            if length is not None:
                self.send_header("Content-Length", str(length))
            self.end_headers()

        def _send(self, data: bytes) -> None:
            self.wfile.write(data)
            self.wfile.flush()

        def _completion(self, k: int) -> None:
            if kind == "500":
                self.send_response(500)
                self.end_headers()
                return self._send(b"internal error")
            if kind in ("stall-first", "good-then-stall") and not (
                kind == "good-then-stall" and k == 1
            ):
                release.wait(STALL_S)
                return None
            if kind == "good-then-stall":
                self._stream_head()
                return self._send(GOOD)
            self._stream_head(4096 if kind == "truncated" else None)
            if kind == "garbage":
                self._send(b"<html><body>this is not an event stream</body></html>\n")
            elif kind == "not-json":
                self._send(b"data: <html>502 Bad Gateway</html>\n\n")
            elif kind == "truncated":  # Content-Length promises more than comes
                self._send(TOKEN + b'data: {"content": "b", "tok')
            elif kind == "cut-mid-event":  # HTTP/1.0: the body ends inside an event
                self._send(TOKEN + b'data: {"content": "b", "tok')
            elif kind == "no-end":  # tokens, then the connection closes: no last event
                self._send(TOKEN * 2)
            elif kind == "stall-between":
                self._send(TOKEN)
                release.wait(STALL_S)
            elif kind == "keepalive":  # one token, then only comments: no event ever again
                self._send(TOKEN)
                while not release.wait(0.05):
                    self._send(b": ping\n\n")
            elif kind == "trickle":  # an event every 0.1 s, forever: the whole-request bound
                while not release.wait(0.1):
                    self._send(TOKEN)
            elif kind == "no-tokens":
                self._send(_event({"content": ""}) + _event({"content": "", "stop": True}))
            elif kind == "huge-line":
                piece = b"x" * 2**20
                self._send(b"data: ")
                for _ in range(MAX_LINE_CHARS // len(piece) + 1):
                    if release.is_set():
                        break
                    self._send(piece)
            elif kind == "json-not-object":
                self._send(b"data: [1, 2, 3]\n\n" + LAST)
            else:  # reference / good
                self._send(GOOD)
            return None

    srv = _Server(("127.0.0.1", 0), H)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    POSTS[url] = seen
    try:
        yield url
    finally:
        POSTS.pop(url, None)
        release.set()
        srv.shutdown()
        srv.server_close()


def refused_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    return f"http://127.0.0.1:{port}"


@contextmanager
def target(kind: str) -> Iterator[str]:
    if kind == "refused":
        yield refused_url()
    else:
        with server(kind) as url:
            yield url


# small bounds: a stall is found in half a second, a whole request in 1 s
BOUNDS = ["--timeout-s", "1", "--connect-timeout-s", "1", "--first-byte-timeout-s", "0.5",
          "--event-timeout-s", "0.5"]  # fmt: skip

# each misbehaviour and what the first error says
KINDS = {
    "refused": "ConnectError",
    "500": "HTTP 500",
    "garbage": "carried no token",
    "not-json": "not JSON",
    "json-not-object": "not a JSON object",
    "truncated": "RemoteProtocolError",
    "cut-mid-event": "not JSON",
    "no-end": "cut short",
    "stall-first": "--first-byte-timeout-s",
    "stall-between": "--event-timeout-s",
    "keepalive": "--event-timeout-s",
    "trickle": "--timeout-s",
    "no-tokens": "carried no token",
    "huge-line": "longer than",
}


def _errors(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if ln.startswith("specsim: error")]


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(KINDS))
def test_bench_against_a_broken_server_exits_1_naming_the_first_error(kind, tmp_path, capsys):
    out = tmp_path / "runs.csv"
    t0 = time.monotonic()
    with target(kind) as url:
        code = main(["bench", "--url", url, "--prompts", "mt-bench[:3]", "--concurrency", "2",
                     "--max-tokens", "4", *BOUNDS, "--out", str(out)])  # fmt: skip
    took = time.monotonic() - t0
    err = capsys.readouterr().err
    assert code == 1, err
    lines = _errors(err)
    assert len(lines) == 1, err
    assert "3 of 3 requests failed" in lines[0] and "first error" in lines[0], lines[0]
    assert KINDS[kind] in lines[0], lines[0]
    assert "Traceback" not in err
    table = pd.read_csv(out)
    assert len(table) == 3 and table["partial"].all()
    assert took < 6.0, f"{kind}: {took:.1f} s"  # two rounds of C=2 within the bounds


def test_a_good_server_still_passes(tmp_path, capsys):
    """The bounds and the end-of-stream check do not fail a server that answers well."""
    with server("good") as url:
        code = main(["bench", "--url", url, "--prompts", "mt-bench[:3]", "--concurrency", "2",
                     "--max-tokens", "4", *BOUNDS, "--json"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    s = json.loads(out)
    assert s["requests_completed"] == 3 and s["output_tokens"] == 12


@pytest.mark.parametrize("flag", ["--connect-timeout-s", "--first-byte-timeout-s",
                                  "--event-timeout-s"])  # fmt: skip
@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "1e9"])
def test_bad_time_bounds_are_refused_before_any_connection(flag, value, capsys):
    code = main(["bench", "--url", refused_url(), "--prompts", "mt-bench[:3]", flag, value])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and flag in err[0], err


AUDIT_KINDS = ["refused", "500", "garbage", "not-json", "truncated", "cut-mid-event",
               "stall-first", "stall-between", "keepalive", "trickle", "no-tokens", "huge-line",
               "json-not-object"]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("kind", AUDIT_KINDS)
def test_the_audit_against_a_broken_server_is_one_line_nonzero(kind, capsys):
    """check-lossless --server: a good reference, a broken audited server; the first
    generation fails and the audit stops in one line (exit 2), bounded by --timeout-s."""
    t0 = time.monotonic()
    with server("reference") as ref, target(kind) as url:
        code = main(["check-lossless", "--server", url, "--reference", ref, "--no-ban-fragments",
                     "--n-predict", "4", "--tokens", "1024", "--timeout-s", "1"])  # fmt: skip
    err = capsys.readouterr().err
    assert code not in (0, 1), err  # 1 would be a LOSSY verdict
    lines = _errors(err)
    assert len(lines) == 1 and "bug in specsim" not in lines[0], err
    assert "Traceback" not in err
    assert time.monotonic() - t0 < 6.0


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["refused", "500", "garbage", "not-json", "stall-first"])
def test_the_audit_against_a_broken_reference_is_one_line_nonzero(kind, capsys):
    with target(kind) as ref, server("good") as url:
        code = main(["check-lossless", "--server", url, "--reference", ref, "--no-ban-fragments",
                     "--n-predict", "4", "--tokens", "1024", "--timeout-s", "1"])  # fmt: skip
    err = capsys.readouterr().err
    lines = _errors(err)
    assert code == 2 and len(lines) == 1 and "bug in specsim" not in lines[0], err


def _bench_process(url: str, out: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SPECSIM_PROGRESS": "0"}
    return subprocess.Popen(
        [sys.executable, "-m", "specsim.cli", "bench", "--url", url, "--prompts", "mt-bench[:3]",
         "--concurrency", "1", "--max-tokens", "4", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_stops_bench_and_keeps_what_it_measured(sig, code, tmp_path):
    """The first request completes, the second stalls (default bounds: minutes); the signal
    stops the client at once: exit 128 + the signal, one line, the summary printed, the table
    written with the completed request and the one cut short, marked partial."""
    out = tmp_path / "runs.csv"
    with server("good-then-stall") as url:
        proc = _bench_process(url, out)
        deadline = time.monotonic() + 20
        # the second request is in flight once the server has seen two posts
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
            if _posts(url) >= 2:
                break
        time.sleep(0.3)
        proc.send_signal(sig)
        try:
            stdout, stderr = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert proc.returncode == code, stderr
    lines = _errors(stderr)
    assert len(lines) == 1 and f"interrupted by {sig.name}" in lines[0], stderr
    assert "1 of 3 requests completed" in lines[0] and "marked partial" in lines[0]
    assert "successful requests" in stdout
    table = pd.read_csv(out)
    assert len(table) == 2 and table["partial"].all()
    assert table["error"].isna().iloc[0] and "interrupted" in table["error"].iloc[1]


def _stdout_cases() -> list:
    cases = [("closed", "good", 2, "standard output is closed; the result is kept in"),
             ("closed", "500", 1, "3 of 3 requests failed")]  # fmt: skip
    if Path("/dev/full").exists():
        cases += [("full", "good", 2, "could not write to standard output (no space left"),
                  ("full", "500", 1, "3 of 3 requests failed")]  # fmt: skip
    return cases


@pytest.mark.slow
@pytest.mark.parametrize("stdout, kind, code, says", _stdout_cases())
def test_a_closed_or_full_stdout_keeps_the_out_file(stdout, kind, code, says, tmp_path):
    """bench --out FILE with stdout closed (``>&-``) or full (/dev/full): the table is written,
    one line on stderr says what was lost (or the run's own failure), exit non-zero."""
    out = tmp_path / "runs.csv"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SPECSIM_PROGRESS": "0"}
    with server(kind) as url, open(os.devnull if stdout == "closed" else "/dev/full", "w") as f:
        proc = subprocess.run(
            [sys.executable, "-m", "specsim.cli", "bench", "--url", url, "--prompts",
             "mt-bench[:3]", "--concurrency", "2", "--max-tokens", "4", *BOUNDS, "--out",
             str(out)],
            stdout=f, stderr=subprocess.PIPE, text=True, env=env, timeout=15,
            preexec_fn=(lambda: os.close(1)) if stdout == "closed" else None,
        )  # fmt: skip
    assert proc.returncode == code, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], proc.stderr
    assert len(pd.read_csv(out)) == 3


class _Chunks:
    """A stand-in for an httpx streaming response that yields these text chunks."""

    def __init__(self, *chunks: str) -> None:
        self.chunks = chunks

    async def aiter_text(self):  # noqa: ANN201
        for c in self.chunks:
            yield c


def _lines(*chunks: str, limit: int | None = None) -> list[str]:
    import asyncio

    from specsim.serve.sse import sse_lines

    async def collect() -> list[str]:
        return [ln async for ln in sse_lines(_Chunks(*chunks), limit)]

    return asyncio.run(collect())


def test_the_line_reader_splits_as_httpx_and_bounds_a_line():
    from specsim.serve.sse import StreamError

    assert _lines("da", "ta: 1\n", "data: 2\r\n\r\n", "data: 3\rlast") == [
        "data: 1", "data: 2", "", "data: 3", "last"]  # fmt: skip
    assert _lines("x" * 10 + "\n", limit=10) == ["x" * 10]
    for chunks in (("x" * 11,), ("x" * 6, "x" * 5 + "\n"), ("x" * 11 + "\nok\n",)):
        with pytest.raises(StreamError, match="longer than 10 characters"):
            _lines(*chunks, limit=10)


@pytest.mark.slow
@pytest.mark.parametrize("stdout", ["closed", "full"])
def test_any_command_with_out_keeps_its_file_when_stdout_fails(stdout, tmp_path):
    """The rule is the CLI's, not bench's: replay --out FILE to a closed or full stdout."""
    if stdout == "full" and not Path("/dev/full").exists():
        pytest.skip("no /dev/full on this system")
    trace, out = tmp_path / "t.parquet", tmp_path / "r.csv"
    assert main(["traces", "synth", "--out", str(trace), "--requests", "8", "--output-len",
                 "20", "--prompt-len", "32", "--seed", "1"]) == 0  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SPECSIM_PROGRESS": "0"}
    with open(os.devnull if stdout == "closed" else "/dev/full", "w") as f:
        proc = subprocess.run(
            [sys.executable, "-m", "specsim.cli", "replay", str(trace), "--requests", "4",
             "--allow-unsteady", "--out", str(out)],
            stdout=f, stderr=subprocess.PIPE, text=True, env=env, timeout=15,
            preexec_fn=(lambda: os.close(1)) if stdout == "closed" else None,
        )  # fmt: skip
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert f"the result is kept in {out}" in lines[0] and out.stat().st_size > 0
