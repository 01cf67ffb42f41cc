"""The hostile corpus of issue 49 against ``specsim bench``, the prompt reader and ``validate
--engine llama-server`` (one representative case per class it found).

Each class once: a server whose counts are impossible (the request fails naming the field, so
the run exits 1, never 0 with a negative or null headline), an error object streamed inside a
200 answer (its message is the error), a ``--cv`` that would divide by zero, a prompt file the
reader cannot take (one line naming the file, exit 2), a ``--url`` that would connect somewhere
else than it reads (refused before connecting), and llama-server answers the validation grid
cannot use (one line naming the path; a stalled answer bounded; failed requests fail the run).
Servers are local (127.0.0.1), started and stopped by each test.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from test_broken_server import BOUNDS, TOKEN, _errors, _event, _Server, bounded, server

from specsim.cli import main
from specsim.errors import RunFailed, SpecsimError

__all__ = ["bounded"]  # the time bound of every test here, as in test_broken_server


@contextmanager
def answering(body: bytes | None = None, by_path: dict[str, object] | None = None) -> Iterator[str]:
    """A server on 127.0.0.1: a POST to a path in ``by_path`` gets that JSON (``bytes``: that
    raw body; ``None``: no answer until the test ends), any other POST streams ``body``."""
    release = threading.Event()
    paths = by_path or {}

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # the body ends when the connection closes

        def log_message(self, *a: object) -> None:  # quiet
            pass

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path in paths:
                ans = paths[self.path]
                if ans is None:
                    release.wait(5.0)
                    return
                raw = ans if isinstance(ans, bytes) else json.dumps(ans).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(raw)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            self.wfile.write(body or b"")

    srv = _Server(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        release.set()
        srv.shutdown()
        srv.server_close()


def _last(**timings: object) -> bytes:
    return _event({"content": "", "stop": True, "timings": {"prompt_n": 3, **timings}})


def _oai(usage: dict) -> bytes:
    chunks = [{"choices": [{"index": 0, "text": "a", "finish_reason": None}]}] * 3
    chunks.append({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]})
    chunks.append({"choices": [], "usage": usage})
    return b"".join(_event(c) for c in chunks) + b"data: [DONE]\n\n"


def _bench(url: str, *extra: str) -> list[str]:
    return ["bench", "--url", url, "--prompts", "mt-bench[:2]", "--concurrency", "2",
            "--max-tokens", "4", *BOUNDS, *extra]  # fmt: skip


# each impossible answer and what the first error names
IMPOSSIBLE = {
    "predicted-negative": (TOKEN * 4 + _last(predicted_n=-50), "llama", "timings.predicted_n"),
    "predicted-huge": (TOKEN * 4 + _last(predicted_n=1e300), "llama", "timings.predicted_n"),
    "predicted-bool": (TOKEN * 4 + _last(predicted_n=True), "llama", "timings.predicted_n"),
    "draft-accepted-gt-drafted": (
        TOKEN * 4 + _last(predicted_n=4, draft_n=4, draft_n_accepted=40),
        "llama",
        "draft_n_accepted = 40 > timings.draft_n = 4",
    ),
    "draft-negative": (TOKEN * 4 + _last(predicted_n=4, draft_n=-5), "llama", "timings.draft_n"),
    "final-only": (_last(predicted_n=4), "llama", "carried no token"),
    "usage-negative": (
        _oai({"prompt_tokens": 3, "completion_tokens": -7}),
        "completions",
        "usage.completion_tokens",
    ),
    "error-in-200-stream": (
        _event({"error": {"code": 500, "message": "the model crashed", "type": "server_error"}}),
        "llama",
        "the model crashed",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(IMPOSSIBLE))
def test_an_impossible_server_answer_fails_the_request_naming_the_field(kind, capsys):
    body, api, says = IMPOSSIBLE[kind]
    with answering(body) as url:
        code = main(_bench(url, "--api", api, "--json"))
    cap = capsys.readouterr()
    assert code == 1, cap.err
    lines = _errors(cap.err)
    assert len(lines) == 1 and "2 of 2 requests failed" in lines[0], cap.err
    assert says in lines[0], lines[0]
    assert "Traceback" not in cap.err


def test_no_drafts_at_all_is_no_acceptance_rate_not_a_nan(capsys):
    with answering(TOKEN * 4 + _last(predicted_n=4, draft_n=0, draft_n_accepted=0)) as url:
        code = main(_bench(url, "--json"))
    s = json.loads(capsys.readouterr().out)
    assert code == 0 and s["draft_tokens"] == 0 and "verify_efficiency" not in s


def test_one_token_per_request_says_tpot_is_undefined(capsys):
    # --max-tokens 1: every request generates one token, so no TPOT exists
    with answering(TOKEN + _last(predicted_n=1)) as url:
        args = _bench(url, "--json")
        args[args.index("--max-tokens") + 1] = "1"
        code = main(args)
    cap = capsys.readouterr()
    assert code == 0, cap.err
    assert "TPOT is undefined" in cap.err


@pytest.mark.parametrize("cv", ["1e200", "1e-200"])
def test_a_cv_outside_its_range_is_refused(cv, capsys):
    code = main(["bench", "--url", "http://127.0.0.1:9", "--prompts", "mt-bench[:2]", "--rate",
                 "5", "--cv", cv])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and len(_errors(err)) == 1 and "--cv" in err, err
    assert "internal error" not in err


def _prompt_file(tmp_path: Path, kind: str) -> str:
    if kind == "proc-self-mem":
        return "/proc/self/mem"
    if kind == "long-name":
        return str(tmp_path / ("p" * 300 + ".jsonl"))
    if kind == "long-path":
        return "/" + "d" * 5000 + "/x.jsonl"
    lines = {
        "big-int": '{"turns": ["x"], "n": ' + "9" * 5000 + "}",
        "deep-nest": "[" * 200_000,
        "lone-surrogate": '{"turns": ["a\\ud800b"]}',
        "turns-string": '{"turns": "abc"}',
    }
    path = tmp_path / f"{kind}.jsonl"
    path.write_text('{"turns": ["fine"]}\n' + lines[kind] + "\n")
    return str(path)


@pytest.mark.parametrize(
    "kind",
    [
        "big-int",
        "deep-nest",
        "lone-surrogate",
        "turns-string",
        "long-name",
        "long-path",
        "proc-self-mem",
    ],  # fmt: skip
)
def test_a_prompt_file_the_reader_cannot_take_is_one_line_naming_it(kind, tmp_path, capsys):
    path = _prompt_file(tmp_path, kind)
    if kind == "proc-self-mem" and not Path(path).exists():
        pytest.skip("no /proc")
    code = main(["bench", "--url", "http://127.0.0.1:9", "--prompts", path, *BOUNDS])
    err = capsys.readouterr().err
    lines = _errors(err)
    assert code == 2 and len(lines) == 1, err
    assert "internal error" not in err and "Traceback" not in err
    assert path[:60] in lines[0], lines[0]
    if kind not in ("long-name", "long-path", "proc-self-mem"):
        assert f"{path}:2 " in lines[0], lines[0]  # the line too


BAD_URLS = {
    "newline": "http://127.0.0.1:{p}\n",
    "tab": "http://127.0.0.1:{p}\t/x",
    "space-in-host": "http://exa mple.com:{p}",
    "trailing-space": "http://127.0.0.1:{p} ",
    "label-over-63": "http://" + "a" * 64 + ".com:{p}",
    "query": "http://127.0.0.1:{p}?a=b",
    "fragment": "http://127.0.0.1:{p}#frag",
    "backslash": "http://127.0.0.1:{p}\\@evil.example",
    "ipv6-unclosed": "http://[::1",
    "ipv4-in-brackets": "http://[127.0.0.1]:{p}",
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(BAD_URLS))
def test_a_url_that_would_go_elsewhere_is_refused_before_connecting(kind, capsys):
    with server("good") as good:
        url = BAD_URLS[kind].format(p=good.rsplit(":", 1)[1])
        code = main(_bench(url))
    err = capsys.readouterr().err
    lines = _errors(err)
    assert code == 2 and len(lines) == 1 and "--url" in lines[0], err
    if kind not in ("newline", "tab", "trailing-space", "space-in-host"):
        assert "port outside" not in lines[0], lines[0]


def test_an_upper_case_scheme_is_a_url(capsys):
    with server("good") as good:
        code = main(_bench("HTTP://" + good.split("://", 1)[1], "--json"))
    assert code == 0, capsys.readouterr().err


# ---------------------------------------------------------------- validate --engine llama-server


def _llama(url: str):  # noqa: ANN202 - a LlamaServer pointed at ``url``, never started
    from specsim.serve.llama_server import LlamaServer, ServerSpec

    return LlamaServer(ServerSpec(model=Path("m.gguf"), port=int(url.rsplit(":", 1)[1])))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("answers", "says"),
    [
        ({"/apply-template": {"text": "no prompt key"}}, "/apply-template"),
        ({"/apply-template": {"prompt": "p"}, "/tokenize": {"tokens": ["a"]}}, "/tokenize"),
        ({"/apply-template": b"<html>busy</html>"}, "not JSON"),
    ],
)
def test_a_bad_tokenizer_answer_is_one_line_naming_the_path(answers, says):
    from specsim.serve.llama_tokens import chat_prompt_ids

    with answering(by_path=answers) as url, pytest.raises(SpecsimError, match=says) as exc:
        chat_prompt_ids(_llama(url), ["hi"])
    assert "\n" not in str(exc.value)


@pytest.mark.slow
@pytest.mark.parametrize(
    "answer",
    [
        {"content": "x", "timings": None},
        b'{"content": "x", "timings": {"predicted_n": NaN}}',
        b"<html>busy</html>",
    ],  # fmt: skip
)
def test_a_bad_completion_answer_is_one_line_naming_it(answer):
    from specsim.fidelity.llama.config import LlamaValidationConfig
    from specsim.fidelity.llama.traces import natural_lengths

    with answering(by_path={"/completion": answer}) as url, pytest.raises(SpecsimError) as exc:
        natural_lengths(_llama(url), [[1, 2]], LlamaValidationConfig())
    assert "/completion" in str(exc.value) and "\n" not in str(exc.value)


def test_a_completion_that_never_answers_is_bounded(monkeypatch):
    import time

    from specsim.fidelity.llama.config import LlamaValidationConfig
    from specsim.fidelity.llama.traces import natural_lengths
    from specsim.serve import llama_server

    monkeypatch.setattr(llama_server, "COMPLETION_BASE_S", 0.5)
    monkeypatch.setattr(llama_server, "COMPLETION_PER_TOKEN_S", 0.0)
    t0 = time.monotonic()
    with answering(by_path={"/completion": None}) as url:
        with pytest.raises(SpecsimError, match="did not answer within 0.5 s"):
            natural_lengths(_llama(url), [[1, 2]], LlamaValidationConfig())
    assert time.monotonic() - t0 < 3.0


def test_failed_grid_requests_fail_validate_naming_the_first_error():
    from specsim.fidelity.llama.grid import check_failed

    ok = {"spec": "none", "temperature": 0.0, "concurrency": 1, "rate": None, "requests": 3,
          "failed": 0, "first_error": ""}  # fmt: skip
    bad = {**ok, "concurrency": None, "rate": 1.0, "requests": 2, "failed": 2,
           "first_error": "HTTP 500: boom"}  # fmt: skip
    with pytest.raises(RunFailed, match=r"2 of 5 grid requests failed \(cell none T=0 rate=1\); "
                       "first error: HTTP 500"):  # fmt: skip
        check_failed([ok, bad])
    check_failed([ok])  # none failed: no error


@pytest.mark.parametrize("threads", ["0", "-4"])
def test_server_threads_is_named_as_itself(threads, tmp_path, capsys):
    code = main(["validate", "--engine", "llama-server", "--out", str(tmp_path / "v"),
                 "--server-threads", threads])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "--server-threads must be at least 1" in err, err
