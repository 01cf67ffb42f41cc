"""``specsim bench`` never exits 0 when its requests failed (issue: reliability v3).

Broken local servers on 127.0.0.1, started and stopped by each test: a refused port, one that
answers HTTP 500, one that sends garbage instead of server-sent events. Every run that loses
all its requests exits 1 with one line naming the count and the first error; the per-request
table is still written and marked partial; ``--max-failed-share`` lets a user accept some.
Bad flags are refused before any connection, one line, exit 2.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pandas as pd
import pytest

from specsim.cli import main


@contextmanager
def _server(kind: str) -> Iterator[str]:
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a) -> None:  # quiet
            pass

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            n = int(self.headers.get("Content-Length", 0))
            self.rfile.read(n)
            if kind == "500":
                self.send_response(500)
                self.end_headers()
                self.wfile.write(b"internal error")
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            self.wfile.write(b"this is not an event stream\n\n")

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def _refused_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    return f"http://127.0.0.1:{port}"


def _bench(url: str, tmp_path, *extra: str) -> list[str]:
    return ["bench", "--url", url, "--prompts", "mt-bench[:3]", "--concurrency", "2",
            "--max-tokens", "4", "--timeout-s", "5", *extra]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["refused", "500", "garbage"])
def test_a_run_whose_requests_all_fail_exits_1_and_keeps_the_table(kind, tmp_path, capsys):
    out = tmp_path / "runs.csv"
    if kind == "refused":
        code = main(_bench(_refused_url(), tmp_path, "--out", str(out)))
    else:
        with _server(kind) as url:
            code = main(_bench(url, tmp_path, "--out", str(out)))
    assert code == 1
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("specsim: error")]
    assert len(err) == 1 and "3 of 3 requests failed" in err[0] and "first error" in err[0]
    table = pd.read_csv(out)
    assert len(table) == 3 and table["partial"].all() and (table["error"].str.len() > 0).all()


def test_max_failed_share_lets_a_user_accept_failures(tmp_path, capsys):
    with _server("500") as url:
        assert main(_bench(url, tmp_path, "--max-failed-share", "1")) == 1  # nothing completed
    assert "requests failed" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flag, value",
    [("--requests", "0"), ("--timeout-s", "0"), ("--timeout-s", "-1"), ("--timeout-s", "nan"),
     ("--temperature", "nan"), ("--url", "http://:8080"), ("--url", "http://127.0.0.1:99999"),
     ("--rate", "5e-324"), ("--max-tokens", "100000000"), ("--max-failed-share", "2")],
)  # fmt: skip
def test_bad_flags_are_refused_before_any_connection(flag, value, tmp_path, capsys):
    argv = _bench(_refused_url(), tmp_path)
    if flag in argv:
        i = argv.index(flag)
        argv[i + 1] = value
    else:
        argv += [flag, value]
    if flag == "--rate":
        i = argv.index("--concurrency")
        del argv[i : i + 2]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("specsim: error:"), err


def test_prompt_files_that_cannot_be_prompts_are_refused_in_one_line(tmp_path, capsys):
    """A directory, a FIFO (reading would block forever) and a Latin-1 file: exit 2 before any
    connection, one line naming the file and the fix, the line number for bad bytes."""
    import os

    from specsim.cli import main

    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n')
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    empty = tmp_path / "empty-turn.jsonl"
    empty.write_text('{"turns": [""]}\n')
    cases = {tmp_path: "is a directory", fifo: "not a regular file",
             latin: "latin.jsonl:2 is not UTF-8", empty: "empty-turn.jsonl:1"}  # fmt: skip
    for path, says in cases.items():
        code = main(["bench", "--url", "http://127.0.0.1:9", "--prompts", str(path)])
        err = capsys.readouterr().err
        assert code == 2, (path, err)
        assert says in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_the_audit_checks_its_urls_before_connecting(capsys):
    """check-lossless --server refuses a port out of range or an empty host in one line naming
    the flag, exit 2, before it tries the reference (which does not exist here)."""
    from specsim.cli import main

    for argv, says in (
        (["--server", "http://127.0.0.1:99999", "--reference", "http://127.0.0.1:9"],
         "--server 'http://127.0.0.1:99999' has a port outside"),
        (["--server", "http://", "--reference", "http://127.0.0.1:9"],
         "--server 'http://' names no host"),
        (["--server", "http://127.0.0.1:9", "--reference", "ftp://x"],
         "--reference 'ftp://x' must start"),
    ):  # fmt: skip
        assert main(["check-lossless", *argv]) == 2
        err = capsys.readouterr().err
        assert says in err and len(err.strip().splitlines()) == 1, err
