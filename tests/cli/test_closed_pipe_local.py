"""`ddtreectl status | head -1`: a reader that leaves before ddtreectl has written ends it the way it ends
git and coreutils, as SIGPIPE (the shell sees 141), with no traceback and nothing on stderr, on every
command; before, Click and Rich turned the BrokenPipeError into a silent exit 1, indistinguishable from
a failure. An EPIPE that is NOT our output's (an SSH socket, a pipe to rsync) is a real error and must
stay one instead of being swallowed the same way.

The pipe is real: the INSTALLED console script writes into an os.pipe() whose read end was closed
before it started (what `| head -1` leaves once head has its line), on a `transport: local` host."""

from __future__ import annotations

import os
import select
import signal
import subprocess
from pathlib import Path

import pytest

from ddtreectl.cli import pipes
from tests.cli.local_box import installed_ddtreectl, make_local_box


@pytest.fixture
def idle_box(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    return make_local_box(tmp_path, "nvidia-smi-gpus-h200-1x.txt")


def run_into_closed_pipe(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has left
    try:
        return subprocess.run([installed_ddtreectl(), *args], stdout=write_end, stderr=subprocess.PIPE, text=True,
                              timeout=120, env=env)
    finally:
        os.close(write_end)


COMMANDS = [
    ["status", "box"],
    ["status", "box", "--json"],
    ["gpus", "box", "--samples", "1"],
    ["gpus", "box", "--samples", "1", "--json"],
    ["mode", "box"],
    ["lock", "status", "box"],
    ["--help"],
    ["deploy", "--help"],
]


@pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
def test_reader_gone_ends_as_sigpipe(idle_box: tuple[Path, Path, dict[str, str]], args: list[str]) -> None:
    inventory, _, env = idle_box
    # The same command into an open pipe succeeds and prints: the SIGPIPE below is the reader's doing.
    ok = subprocess.run([installed_ddtreectl(), "-i", str(inventory), *args], capture_output=True, text=True,
                        timeout=120, env=env)
    assert ok.returncode == 0 and ok.stdout, ok.stdout + ok.stderr
    cut = run_into_closed_pipe(env, "-i", str(inventory), *args)
    assert cut.returncode == -signal.SIGPIPE, (cut.returncode, cut.stderr)
    assert cut.stderr == ""


def test_command_holding_a_lock_releases_it_before_ending(idle_box: tuple[Path, Path, dict[str, str]]) -> None:
    """The signal is not let loose while a command runs: the BrokenPipeError unwinds every `finally:`
    (locks released) before ddtreectl ends itself as SIGPIPE."""
    inventory, root, env = idle_box
    cut = run_into_closed_pipe(env, "-i", str(inventory), "mode", "box", "dev", "--reason", "bench",
                               "--idle-timeout", "30")
    assert cut.returncode == -signal.SIGPIPE, (cut.returncode, cut.stderr)
    assert "Traceback" not in cut.stderr
    assert not (root / "state" / "locks" / "mode.lock").exists()
    assert '"holder": "carol@' in (root / "state" / "mode.json").read_text()  # the switch itself completed


def test_failing_command_into_closed_pipe_still_says_why(idle_box: tuple[Path, Path, dict[str, str]]) -> None:
    """An error goes to stderr, which still has its reader: it is printed, then the JSON document's
    write to the gone stdout ends the process as it would end `ls /missing /etc | true`."""
    inventory, _, env = idle_box
    cut = run_into_closed_pipe(env, "-i", str(inventory), "status", "nosuch", "--json")
    assert "error: " in cut.stderr and "'nosuch' is neither a host nor a group" in cut.stderr
    assert cut.returncode == -signal.SIGPIPE
    plain = run_into_closed_pipe(env, "-i", str(inventory), "status", "nosuch")  # nothing written to stdout
    assert plain.returncode == 3 and "'nosuch'" in plain.stderr


def test_epipe_that_is_not_our_output_is_an_error(idle_box: tuple[Path, Path, dict[str, str]],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A broken pipe to something else (here raised where the status probe runs, as a dropped SSH socket
    or a dead rsync would) while stdout is fine: it propagates as itself (exit 1 with its traceback,
    like any internal error), not as Click's silent `sys.exit(1)`, and not as SIGPIPE."""
    from ddtreectl.cli import main as cli_main
    from ddtreectl.operations import status as status_op

    inventory, _, _ = idle_box

    def broken(*args: object, **kwargs: object) -> None:
        raise BrokenPipeError(32, "Broken pipe (a socket to the host)")

    monkeypatch.setattr(status_op, "gather_status", broken)
    assert not pipes.output_closed()
    with pytest.raises(BrokenPipeError, match="a socket to the host"):
        cli_main.main(["-i", str(inventory), "status", "box"])


def test_reader_gone_tells_a_closed_pipe_from_a_full_one() -> None:
    read_end, write_end = os.pipe()
    try:
        os.set_blocking(write_end, False)
        try:
            while True:
                os.write(write_end, b"x" * 65536)
        except BlockingIOError:
            pass
        assert select.select([], [write_end], [], 0)[1] == []  # full: a slow reader, not a gone one
        assert not pipes.reader_gone(write_end)
        os.close(read_end)
        read_end = -1
        assert pipes.reader_gone(write_end)
    finally:
        os.close(write_end)
        if read_end >= 0:
            os.close(read_end)
