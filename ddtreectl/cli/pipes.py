"""A reader that went away: `ddtreectl status | head -1` ends the way `git log | head -1` does.

git and coreutils die of SIGPIPE when they write to a pipe nobody reads any more: no message, and the
shell sees 128 + 13 = 141 (which `set -o pipefail` scripts already know from them). Python ignores
SIGPIPE, so the write raises BrokenPipeError instead, and Click turns ANY EPIPE inside a command into a
silent exit 1, even one from an SSH socket or an rsync pipe, which is a real failure. Here an EPIPE
ends ddtreectl as SIGPIPE only when our own stdout or stderr has lost its reader; anything else is
re-raised as the internal error it is.

The signal stays ignored while commands run, so the exception unwinds every `finally:` first (host
locks released, SSH channels closed); only then does the process kill itself with SIGPIPE.
"""

from __future__ import annotations

import errno
import os
import select
import signal
import sys
from typing import NoReturn


def epipe_of(exc: BaseException) -> OSError | None:
    """The EPIPE behind `exc`: the exception itself, or the one Click's `sys.exit(1)` replaced
    (Click raises SystemExit inside its `except OSError` block, so the original is its context)."""
    if isinstance(exc, OSError) and exc.errno == errno.EPIPE:
        return exc
    if isinstance(exc, SystemExit) and isinstance(exc.__context__, OSError) and exc.__context__.errno == errno.EPIPE:
        return exc.__context__
    return None


def reader_gone(fd: int) -> bool:
    """Whether writing to `fd` would fail for want of a reader: a pipe whose read end is closed polls
    POLLERR, a socket whose peer left POLLHUP/POLLERR. A full pipe or a terminal does neither."""
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    try:
        events = poller.poll(0)
    except OSError:
        return False
    return any(mask & (select.POLLERR | select.POLLHUP) for _, mask in events)


def output_closed() -> bool:
    """Our stdout or stderr has lost its reader."""
    fds = []
    for stream in (sys.__stdout__, sys.__stderr__):
        try:
            fds.append(stream.fileno() if stream is not None else -1)
        except (OSError, ValueError):
            continue
    return any(fd >= 0 and reader_gone(fd) for fd in fds)


def die_of_sigpipe() -> NoReturn:
    """End the process as an unhandled SIGPIPE would: no output (there is nobody to read it), status
    128 + SIGPIPE for the shell. Nothing buffered is flushed: it would only fail again."""
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGPIPE)
    os._exit(128 + signal.SIGPIPE)  # only if the signal could not end us (never seen on Linux)
