"""Start, wait for and stop a llama.cpp ``llama-server`` process on 127.0.0.1.

Why a module: drafter parity checks, tests and engine measurements all need the same few
steps (find the binary, pick a free port, start, wait for ``/health``, send requests, stop
cleanly even when the caller fails), and each step has a failure that should say how to fix it.
The binary is the one ``scripts/install-llama-server.sh`` builds; nothing here imports torch.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specsim.errors import SpecsimError

LLAMA_CPP_BUILD = 11434
# a request that is not a generation (/tokenize, /apply-template) answers in milliseconds
REQUEST_TIMEOUT_S = 30.0
# a non-streamed generation of the validation grid's model (SmolLM2-135M: hundreds of tokens/s
# on one core): this long to start, plus this long per token asked for (10 tokens/s)
COMPLETION_BASE_S, COMPLETION_PER_TOKEN_S = 10.0, 0.1
MAX_ANSWER_BYTES = 64 * 2**20  # far beyond any answer (a few KB), still small in memory
INSTALL_HINT = "build it with scripts/install-llama-server.sh (about 5 minutes on 2 quiet cores)"


def llama_cpp_home() -> Path:
    """Where the install script puts llama.cpp (``$SPECSIM_LLAMA_CPP_HOME`` overrides)."""
    env = os.environ.get("SPECSIM_LLAMA_CPP_HOME")
    if env:
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "specsim" / f"llama.cpp-b{LLAMA_CPP_BUILD}"


def find_llama_server() -> Path:
    """The llama-server binary: ``$SPECSIM_LLAMA_SERVER``, the install script's, or on PATH."""
    env = os.environ.get("SPECSIM_LLAMA_SERVER")
    candidates = [Path(env).expanduser()] if env else []
    candidates.append(llama_cpp_home() / "bin" / "llama-server")
    on_path = shutil.which("llama-server")
    if on_path:
        candidates.append(Path(on_path))
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    raise SpecsimError(f"llama-server not found (looked at {candidates[0]}); {INSTALL_HINT}")


def llama_cpp_source() -> Path:
    """llama.cpp's source tree (convert_hf_to_gguf.py, gguf-py) next to the built binary."""
    src = llama_cpp_home() / "src"
    if not (src / "convert_hf_to_gguf.py").is_file():
        raise SpecsimError(f"llama.cpp's source tree is not at {src}; {INSTALL_HINT}")
    return src


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class ServerSpec:
    """What to start: ``llama-server -m model <args>`` on ``host:port`` (port 0: a free one)."""

    model: Path
    args: tuple[str, ...] = ()
    binary: Path | None = None  # None: find_llama_server()
    host: str = "127.0.0.1"
    port: int = 0
    startup_timeout_s: float = 300.0
    log_path: Path | None = None  # None: a temporary file, removed on stop
    env: dict[str, str] = field(default_factory=dict)


class LlamaServer:
    """A running llama-server; use as a context manager so it is always stopped.

    >>> with LlamaServer(ServerSpec(model=Path("m.gguf"), args=("-c", "2048"))) as srv:
    ...     srv.completion({"prompt": "Hi", "n_predict": 8})  # doctest: +SKIP
    """

    def __init__(self, spec: ServerSpec) -> None:
        self.spec = spec
        self.port = spec.port or free_port(spec.host)
        self.proc: subprocess.Popen[bytes] | None = None
        self._own_log = spec.log_path is None
        self.log_path = spec.log_path or Path(
            os.environ.get("TMPDIR", "/tmp"), f"llama-server-{os.getpid()}-{self.port}.log"
        )

    @property
    def url(self) -> str:
        return f"http://{self.spec.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def command(self) -> list[str]:
        binary = self.spec.binary or find_llama_server()
        return [
            str(binary),
            "-m",
            str(self.spec.model),
            "--host",
            self.spec.host,
            "--port",
            str(self.port),
            *self.spec.args,
        ]

    def start(self) -> LlamaServer:
        """Start the process and wait until ``/health`` answers ok (or fail with its log)."""
        if self.proc is not None:
            raise SpecsimError("this llama-server is already started")
        cmd = self.command()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.spec.env},
            )
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.spec.startup_timeout_s
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise SpecsimError(
                    f"llama-server exited with code {self.proc.returncode} while starting; "
                    f"its log ends with:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200 and json.loads(r.read() or b"{}").get("status") == "ok":
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
                pass  # not listening yet, or 503 while the model loads
            time.sleep(0.5)
        raise SpecsimError(
            f"llama-server did not become healthy within {self.spec.startup_timeout_s:g} s; "
            f"its log ends with:\n{self.log_tail()}"
        )

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """Terminate the process (SIGTERM, then SIGKILL after ``timeout_s``); its exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=timeout_s)
        return self.proc.returncode

    def close(self) -> None:
        """Stop the process and remove the log file when it was a temporary one."""
        self.stop()
        if self._own_log:
            self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def post(self, path: str, payload: dict[str, Any], timeout_s: float = REQUEST_TIMEOUT_S) -> Any:
        """POST JSON to the server and return the decoded answer, within ``timeout_s`` seconds
        in all (a server that never answers, or trickles its answer, is an error naming the
        path, not a wait of hours); an answer that is not JSON is one line naming the path."""
        req = urllib.request.Request(
            self.url + path,
            data=json.dumps(payload).encode(),
            headers={"Content-Type": "application/json"},
        )
        deadline = time.monotonic() + timeout_s
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as r:
                body = _read_until(r, deadline, path)
        except urllib.error.HTTPError as exc:
            body = exc.read(500).decode(errors="replace")
            raise SpecsimError(f"llama-server {path} answered {exc.code}: {body[:500]}") from None
        except (TimeoutError, OSError) as exc:  # socket.timeout, a reset, a refused connection
            if isinstance(exc, TimeoutError) or "timed out" in str(exc):
                raise SpecsimError(
                    f"llama-server {path} did not answer within {timeout_s:g} s; see its log "
                    f"({self.log_path})"
                ) from None
            raise SpecsimError(f"llama-server {path} failed ({exc}); see {self.log_path}") from None
        try:
            return json.loads(body, parse_constant=_no_constant)
        except ValueError as exc:
            raise SpecsimError(
                f"llama-server {path} answered something that is not JSON ({exc}; it begins "
                f"{body[:80]!r}); is this llama.cpp's llama-server?"
            ) from None

    def completion(self, payload: dict[str, Any], timeout_s: float = 600.0) -> dict[str, Any]:
        """``/completion``: the answer carries ``timings`` (``draft_n``, ``draft_n_accepted``).
        A non-streamed answer comes all at once, so only its whole length can be bounded:
        callers that know the model pass :func:`completion_timeout_s` of their ``n_predict``."""
        ans = self.post("/completion", payload, timeout_s)
        if not isinstance(ans, dict):
            raise SpecsimError(f"llama-server /completion answered {str(ans)[:80]}, not an object")
        return ans


def completion_timeout_s(n_predict: int) -> float:
    """The bound of one non-streamed ``/completion`` of ``n_predict`` tokens (seconds)."""
    return COMPLETION_BASE_S + COMPLETION_PER_TOKEN_S * max(n_predict, 0)


def _read_until(r: Any, deadline: float, path: str) -> str:
    """The body of answer ``r`` read piece by piece, refused past ``deadline`` or
    :data:`MAX_ANSWER_BYTES` (each read is bounded by the socket's own timeout)."""
    parts, size = [], 0
    while piece := r.read(65536):
        parts.append(piece)
        size += len(piece)
        if time.monotonic() > deadline:
            raise TimeoutError(path)
        if size > MAX_ANSWER_BYTES:
            raise SpecsimError(
                f"llama-server {path} answered more than {MAX_ANSWER_BYTES:,} bytes; not an "
                "answer llama-server sends"
            )
    return b"".join(parts).decode("utf-8", errors="replace")


def _no_constant(name: str) -> float:
    """``json.loads`` hook: NaN and Infinity are not JSON, and no count can be one."""
    raise ValueError(f"{name} is not a JSON number")
