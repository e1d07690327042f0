"""`ddtreectl deploy`: ship, build, self-test and switch the engine release on hosts, in parallel."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, List, Optional, TypeVar

import typer

from ddtreectl.cli.app import app
from ddtreectl.cli.common import load_inventory
from ddtreectl.errors import ExitCode, InterruptedByOperatorError, UsageError, fan_out_exit_code
from ddtreectl.inventory.models import Host, Inventory

if TYPE_CHECKING:
    from ddtreectl.fleet import FleetResult

T = TypeVar("T")
CLEANUP_GRACE_S = 20.0  # after Ctrl-C: how long the hosts get to release their locks


def resolve_targets(inventory: Inventory, targets: list[str] | None, hosts: list[str] | None,
                    groups: list[str] | None, *, verb: str = "deploy") -> list[Host]:
    """Positional targets, --host and --group together; at least one must be named (never an implicit all)."""
    names = [*(targets or []), *(hosts or []), *(groups or [])]
    if not names:
        raise UsageError(f"name what to {verb}: HOST, GROUP or `all` (or --host HOST, --group GROUP)",
                         hint="hosts: " + ", ".join(sorted(inventory.hosts)))
    for g in groups or []:
        if g not in inventory.groups:
            raise UsageError(f"no group named {g!r}", hint="groups: " + (", ".join(sorted(inventory.groups)) or "none"))
    return inventory.resolve(names)


def engine_dir_for(inventory: Inventory, given: Path | None) -> Path:
    """--engine, else `engine/` beside the inventory, else the engine bundled with this checkout."""
    if given is not None:
        path = given
    else:
        beside = inventory.path.resolve().parent / "engine"
        path = beside if (beside / "CMakeLists.txt").is_file() else Path(__file__).resolve().parents[2] / "engine"
    if not (path / "CMakeLists.txt").is_file():
        raise UsageError(f"{path}: not an engine source tree (no CMakeLists.txt)", hint="pass --engine DIR")
    return path


def fan_out(hosts: list[Host], fn: Callable[[Host, threading.Event], T], deadline_s: float,
            deadline_option: str | None = None,
            finished: Callable[[T], str] = lambda value: "finished before the interrupt") -> "FleetResult[T]":
    """run_on_hosts with Ctrl-C handling: the hosts are told to stop at their next step (a remote
    command in progress is stopped on the host by the transport) and given CLEANUP_GRACE_S to
    release their locks before ddtreectl exits 130, saying per host what state it was left in
    (`finished` words a host that completed before it saw the interrupt)."""
    from ddtreectl.fleet import run_on_hosts

    cancel = threading.Event()
    active = [0]
    cond = threading.Condition()
    left: dict[str, str] = {}  # per host, once its work ended: the state it is left in
    hints: dict[str, str] = {}  # per host: what to do next about that state (a restart left unverified)

    def wrapped(host: Host) -> T:
        with cond:
            active[0] += 1
        try:
            value = fn(host, cancel)
            left[host.name] = finished(value)
            return value
        except BaseException as err:
            left[host.name] = getattr(err, "message", None) or f"{type(err).__name__}: {err}"
            if getattr(err, "hint", None):
                hints[host.name] = str(getattr(err, "hint"))
            raise
        finally:
            with cond:
                active[0] -= 1
                cond.notify_all()

    try:
        return run_on_hosts(hosts, wrapped, deadline_s=deadline_s, deadline_option=deadline_option)
    except KeyboardInterrupt:
        cancel.set()
        end = time.monotonic() + CLEANUP_GRACE_S
        with cond:
            while active[0] and time.monotonic() < end:
                cond.wait(max(0.0, end - time.monotonic()))
            unsettled = [h.name for h in hosts if h.name not in left]
            states = [f"{h.name}: " + left.get(h.name, f"still working after {CLEANUP_GRACE_S:g} s (a switch or a "
                                                        f"restart is not broken off half way); `ddtreectl status "
                                                        f"{h.name}` shows where it ended") for h in hosts]
        lock_hint = (f"`ddtreectl lock status {unsettled[0] if len(unsettled) == 1 else 'HOST'}` shows whether "
                     "its lock is still held") if unsettled else None
        host_hints = [hints[h.name] if len(hosts) == 1 else f"{h.name}: {hints[h.name]}" for h in hosts
                      if h.name in hints]
        raise InterruptedByOperatorError(
            "interrupted:\n  " + "\n  ".join(states),
            hint="\n      ".join(filter(None, [*host_hints, lock_hint])) or None) from None


def exit_code_of(errors: list[BaseException], total: int) -> int:
    return fan_out_exit_code([int(getattr(e, "exit_code", ExitCode.INTERNAL)) for e in errors], total)


def _finished(value: object) -> str:
    """A host whose deploy completed before it saw the interrupt (it was switching or restarting)."""
    release, action = getattr(value, "release", "?"), getattr(value, "action", "?")
    return f"finished before the interrupt took effect ({action}): `current` is {release}"


@app.command("deploy")
def deploy_command(
    targets: Optional[List[str]] = typer.Argument(None, metavar="[TARGET]...", help="Hosts, groups or `all`."),
    host: Optional[List[str]] = typer.Option(None, "--host", "-H", help="A host to deploy to (repeatable)."),
    group: Optional[List[str]] = typer.Option(None, "--group", "-g", help="A group to deploy to (repeatable)."),
    plan: bool = typer.Option(False, "--plan", help="Show what would change on each host; change nothing. "
                              "More than 10 changed files of a kind are summarized (counts per top directory, "
                              "the first 5)."),
    all_files: bool = typer.Option(False, "--all-files", help="With --plan: list every changed file (--json "
                                   "always does)."),
    restart: bool = typer.Option(False, "--restart", help="Restart the service on the new release if it runs or "
                                 "crash-loops, then verify it through restore-service's health gate."),
    lock_wait: float = typer.Option(0.0, "--lock-wait", metavar="SECONDS",
                                    help="Wait up to this long for another deploy's lock."),
    engine: Optional[Path] = typer.Option(None, "--engine", help="Engine source tree (default: engine/ beside "
                                          "the inventory, else the bundled one)."),
    deadline: float = typer.Option(7200.0, "--deadline", help="Give up on hosts still running after this many s."),
    json_out: bool = typer.Option(False, "--json", help="Machine-readable results on stdout."),
) -> None:
    """Deploy the engine: lock, rsync a release (unchanged files hard-linked), build it with CMake +
    ninja for the host's GPU archs, run ddtree-selftest, install units, switch `current` atomically.

    A release already built on the host (same content hash) is not rebuilt. A failed build or
    self-test leaves `current` untouched (exit 5). A running service keeps its release until
    restarted: --restart restarts it (also one crash-looping between Restart= attempts; a stopped
    unit stays stopped) and verifies it through restore-service's health gate (unit active, port,
    /health, readiness, model, /server_info); a failed phase is exit 5 with this start's journal
    lines and the rollback command. A host another operator holds for development (`mode HOST dev`)
    is refused before anything is built or switched (exit 8, naming the holder; the holder's own
    deploy goes through; --plan says so). A unit ddtreectl installed that the inventory no longer
    renders for the host (a profile's unit name changed) is stopped, disabled and deleted, audited;
    a running one only with --restart (before the restart: it holds the port and GPUs), else it is
    left running and reported. Ctrl-C (SIGTERM, SIGHUP) stops the remote build or self-test in
    progress (its process group is killed over the same SSH connection), releases the lock and
    says per host where it stopped and which release is `current`; during --restart's health gate
    it stops waiting and says the state: `current` switched, the unit restarted, its health
    unknown (`status HOST` says whether it serves yet). Exit codes: 0 ok, 5
    build/self-test/remote failure or the restarted service unhealthy, 8 lock held or held for
    development, 6 some hosts failed, 4 unreachable, 130 interrupted.
    """
    from ddtreectl.operations.deploy import DeployOptions, deploy_host
    from ddtreectl.operations.plan import plan_host
    from ddtreectl.operations.release import walk_files
    from ddtreectl.render.units import templates_dir_for
    from ddtreectl.transport import connect
    from ddtreectl.ui import deploy_view

    if json_out:
        from ddtreectl.ui import json_doc

        json_doc.expect("ddtreectl.deploy-plan/1" if plan else "ddtreectl.deploy/1", fan_out=True)
    if all_files and not plan:
        raise UsageError("--all-files lists the files a deploy would change: it goes with --plan",
                         hint="ddtreectl deploy HOST --plan --all-files")
    inventory = load_inventory()
    hosts = resolve_targets(inventory, targets, host, group)
    names = [h.name for h in hosts]
    engine_dir = engine_dir_for(inventory, engine)
    templates = templates_dir_for(inventory)
    files = walk_files(engine_dir)
    if templates.is_dir():
        files += walk_files(templates, "templates/")
    options = DeployOptions(engine_dir=engine_dir, templates_dir=templates if templates.is_dir() else None,
                            files=tuple(files), lock_wait_s=lock_wait, restart=restart)

    if plan:
        def plan_one(h: Host, cancel: threading.Event) -> object:
            with connect(h, inventory) as transport:
                return plan_host(transport, inventory, h, options)

        outcome = fan_out(hosts, plan_one, deadline, "--deadline")
        failed = [(r.host.name, r.error) for r in outcome.failed if r.error is not None]
        code = exit_code_of([e for _, e in failed], len(hosts))
        deploy_view.show_plans([r.value for r in outcome.ok], failed, as_json=json_out,  # type: ignore[misc]
                               targets=names, exit_code=code, all_files=all_files)
        deploy_view.show_errors(failed)
        if code:
            raise typer.Exit(code)
        return

    with deploy_view.DeployProgress([h.name for h in hosts], enabled=not json_out) as progress:
        def deploy_one(h: Host, cancel: threading.Event) -> object:
            with connect(h, inventory) as transport:
                return deploy_host(transport, inventory, h, options, on_event=progress.event, cancel=cancel)

        outcome = fan_out(hosts, deploy_one, deadline, "--deadline", finished=_finished)
    errors = [(r.host.name, r.error) for r in outcome.failed if r.error is not None]
    code = exit_code_of([e for _, e in errors], len(hosts))
    deploy_view.show_results([r.value for r in outcome.ok], errors, as_json=json_out,  # type: ignore[misc]
                             targets=names, exit_code=code)
    if code:
        raise typer.Exit(code)
