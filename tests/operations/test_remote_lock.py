"""Named host locks through the real local shell (the same script runs over SSH in e2e tests)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from ddtreectl.errors import LockHeldError
from ddtreectl.inventory.models import Host
from ddtreectl.operations import remote_lock
from ddtreectl.transport.local import LocalTransport


@pytest.fixture
def local(tmp_path: Path) -> tuple[LocalTransport, str]:
    return LocalTransport(Host(name="local", address="127.0.0.1", transport="local")), str(tmp_path / "root")


def test_second_owner_is_refused_with_the_holder(local: tuple[LocalTransport, str]) -> None:
    transport, root = local
    remote_lock.acquire(transport, root, "deploy", reason="release abc", owner="alice@a")
    with pytest.raises(LockHeldError) as err:
        remote_lock.acquire(transport, root, "deploy", reason="other", owner="bob@b")
    assert err.value.exit_code == 8
    assert "alice@a" in str(err.value) and "release abc" in str(err.value)
    held = remote_lock.status(transport, root, "deploy")
    assert held is not None and held.owner == "alice@a" and held.kind == "auto"


def test_only_the_owner_releases_unless_forced(local: tuple[LocalTransport, str]) -> None:
    transport, root = local
    remote_lock.acquire(transport, root, "deploy", reason="r", owner="alice@a")
    with pytest.raises(LockHeldError):
        remote_lock.release(transport, root, "deploy", owner="bob@b")
    assert remote_lock.release(transport, root, "deploy", owner="bob@b", force=True)
    assert remote_lock.status(transport, root, "deploy") is None
    assert not remote_lock.release(transport, root, "deploy", owner="alice@a")


def _age_lock(root: str, name: str, seconds: int) -> None:
    owner = Path(root) / "state" / "locks" / f"{name}.lock" / "owner.json"
    record = json.loads(owner.read_text())
    record["since"] -= seconds
    owner.write_text(json.dumps(record) + "\n")


def test_expired_automatic_lock_is_taken_over_and_reported(local: tuple[LocalTransport, str]) -> None:
    transport, root = local
    remote_lock.acquire(transport, root, "deploy", reason="crashed run", owner="alice@a", ttl_s=60)
    _age_lock(root, "deploy", 120)
    got = remote_lock.acquire(transport, root, "deploy", reason="new", owner="bob@b")
    assert got.took_over is not None and got.took_over.owner == "alice@a"
    assert remote_lock.status(transport, root, "deploy").owner == "bob@b"  # type: ignore[union-attr]


def test_manual_lock_never_expires(local: tuple[LocalTransport, str]) -> None:
    transport, root = local
    remote_lock.acquire(transport, root, "deploy", reason="hands off", owner="alice@a", kind="manual")
    _age_lock(root, "deploy", 10**7)
    with pytest.raises(LockHeldError) as err:
        remote_lock.acquire(transport, root, "deploy", reason="new", owner="bob@b")
    assert "never expires" in str(err.value)


def test_wait_takes_the_lock_once_it_is_released(local: tuple[LocalTransport, str]) -> None:
    transport, root = local
    remote_lock.acquire(transport, root, "deploy", reason="r", owner="alice@a")
    sleeps: list[float] = []

    def release_on_first_sleep(seconds: float) -> None:
        sleeps.append(seconds)
        remote_lock.release(transport, root, "deploy", owner="alice@a")

    got = remote_lock.acquire(transport, root, "deploy", reason="r2", owner="bob@b", wait_s=30,
                              sleep=release_on_first_sleep)
    assert got.info.owner == "bob@b" and len(sleeps) == 1


def test_a_wait_that_runs_out_says_it_waited(local: tuple[LocalTransport, str]) -> None:
    """`deploy --lock-wait 4` that timed out told the operator to "wait with --lock-wait"."""
    transport, root = local
    remote_lock.acquire(transport, root, "deploy", reason="r", owner="alice@a")
    with pytest.raises(LockHeldError) as err:
        remote_lock.acquire(transport, root, "deploy", reason="r2", owner="bob@b", wait_s=0.2)
    assert "alice@a" in err.value.message and "(still held after waiting 0.2 s)" in err.value.message
    assert err.value.hint is not None and err.value.hint.startswith("wait longer with --lock-wait")
    with pytest.raises(LockHeldError) as err:
        remote_lock.acquire(transport, root, "deploy", reason="r2", owner="bob@b")
    assert "waiting" not in err.value.message
    assert err.value.hint is not None and err.value.hint.startswith("wait with --lock-wait")


def test_racing_owners_exactly_one_wins(local: tuple[LocalTransport, str]) -> None:
    transport, root = local
    outcomes: list[str] = []
    barrier = threading.Barrier(6)

    def contender(i: int) -> None:
        barrier.wait()
        try:
            remote_lock.acquire(transport, root, "mode", reason="race", owner=f"op{i}@x")
            outcomes.append("won")
        except LockHeldError:
            outcomes.append("refused")

    threads = [threading.Thread(target=contender, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["refused"] * 5 + ["won"]


def test_a_racing_acquire_waits_for_the_winners_record(local: tuple[LocalTransport, str]) -> None:
    """The winner's mkdir and its owner record are two steps: a loser arriving between them must still
    name the winner (CI saw 'held by unknown (unreadable owner record) since 1970' with two operators)."""
    transport, root = local
    lock_dir = Path(root) / "state" / "locks" / "mode.lock"
    lock_dir.mkdir(parents=True)  # the winner's mkdir, its record not yet written
    record = {"owner": "alice@a", "reason": "alice's run", "since": 1_700_000_000, "kind": "auto", "ttl_s": None}
    writer = threading.Timer(0.3, lambda: (lock_dir / "owner.json").write_text(json.dumps(record) + "\n"))
    writer.start()
    try:
        with pytest.raises(LockHeldError) as err:
            remote_lock.acquire(transport, root, "mode", reason="bob's run", owner="bob@b")
    finally:
        writer.join()
    assert "alice@a" in str(err.value) and "unreadable" not in str(err.value)
