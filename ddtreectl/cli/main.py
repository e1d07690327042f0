"""Entry point and the CLI's ONE error boundary: DdtreeError -> `error: ...` + `hint: ...` + exit code."""

from __future__ import annotations

import signal
import sys
import threading
import traceback
from types import FrameType

import typer

from ddtreectl.cli.app import OPTIONS, app
from ddtreectl.errors import DdtreeError, ExitCode

# Each import registers its command(s) on `app`. One module per command (shared/design.md).
# (add one line per command module here, e.g. `from ddtreectl.cli import status  # noqa: F401,E402`)
from ddtreectl.cli import status  # noqa: F401,E402
from ddtreectl.cli import logs, render, restore_service  # noqa: F401,E402
from ddtreectl.cli import trust  # noqa: F401,E402
from ddtreectl.cli import set_ip  # noqa: F401,E402
from ddtreectl.cli import gpus, mode  # noqa: F401,E402
from ddtreectl.cli import run as run_command  # noqa: F401,E402  (main.run is the entry point)
from ddtreectl.cli import deploy, lock, rollback  # noqa: F401,E402
from ddtreectl.cli import validate  # noqa: F401,E402


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns (and exits with) the exit code."""
    _interrupt_on_termination()
    try:
        code = run(argv)
        sys.stdout.flush()  # block-buffered into a pipe: a reader that left shows here, not at exit
    except BaseException as exc:
        _end_on_lost_reader(exc)
        raise
    sys.exit(code)


def _end_on_lost_reader(exc: BaseException) -> None:
    """`ddtreectl ... | head -1`: end as SIGPIPE (git's and coreutils' way, cli/pipes.py) when the
    EPIPE is our own output's; an EPIPE from anywhere else (an SSH socket, rsync's pipe) is a real
    failure and is re-raised as itself, not as the silent exit 1 Click makes of every EPIPE."""
    from ddtreectl.cli import pipes

    epipe = pipes.epipe_of(exc)
    if epipe is None:
        return
    if pipes.output_closed():
        pipes.die_of_sigpipe()
    if epipe is not exc:
        raise epipe from None


def _interrupt_on_termination() -> None:
    """SIGTERM (`timeout`, a cancelled CI job, `systemctl stop`) and SIGHUP (the operator's SSH session
    dropped) end Python without running `finally:`, which left host locks held for their whole TTL.
    Treat them like Ctrl-C so the same cleanup runs; a second one kills at once."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        signal.signal(signum, signal.SIG_DFL)
        _INTERRUPTED.set()
        raise KeyboardInterrupt

    def ctrl_c(signum: int, frame: FrameType | None) -> None:
        _INTERRUPTED.set()
        raise KeyboardInterrupt

    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) == signal.SIG_DFL:  # keep an ignored SIGHUP (nohup) ignored
            signal.signal(signum, interrupt)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # an ignored SIGINT stays ignored
        signal.signal(signal.SIGINT, ctrl_c)


# Set by the handlers above. Typer catches a KeyboardInterrupt itself and hands back a bare 130, the
# same as a command's own Exit(130) (`run` passes its CMD's status through): without this mark Ctrl-C
# ended every command but deploy without a word and, with --json, without its document.
_INTERRUPTED = threading.Event()


def run(argv: list[str] | None = None) -> int:
    from ddtreectl.ui import json_doc  # json and dataclasses only: nothing heavy at start-up

    json_doc.reset()
    _INTERRUPTED.clear()
    try:
        result = app(args=argv, standalone_mode=False, prog_name="ddtreectl")
        code = int(result) if isinstance(result, int) else 0
        if code == ExitCode.INTERRUPTED and _INTERRUPTED.is_set():
            return _interrupted(KeyboardInterrupt())
        return code
    except DdtreeError as err:
        if OPTIONS.debug:
            traceback.print_exc()
        print(f"error: {err}", file=sys.stderr)
        if err.hint:
            print(f"hint: {err.hint}", file=sys.stderr)
        json_doc.emit_failure(err, int(err.exit_code))  # --json: stdout still gets its one document
        return int(err.exit_code)
    except typer.Exit as exit_:
        return int(exit_.exit_code)
    except typer.Abort:
        print("interrupted", file=sys.stderr)
        return int(ExitCode.INTERRUPTED)
    except typer.TyperException as err:  # usage errors (exit 2) and other parse errors, shown Click's way
        show = getattr(err, "show", None)
        if callable(show):
            show()
        else:
            print(f"error: {err}", file=sys.stderr)
        return int(err.exit_code)
    except KeyboardInterrupt as err:
        return _interrupted(err)


def _interrupted(err: KeyboardInterrupt) -> int:
    from ddtreectl.ui import json_doc

    print("interrupted", file=sys.stderr)
    json_doc.emit_failure(err, int(ExitCode.INTERRUPTED))
    return int(ExitCode.INTERRUPTED)


if __name__ == "__main__":
    main()
