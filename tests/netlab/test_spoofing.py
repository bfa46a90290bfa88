"""Spoofed HELLO floods against echo-server in the NAT lab (io7m Aeron guide §4.2-§4.3)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from echo.session.admission import EVICTION_GRACE
from tests.netlab.fixtures import nat_lab_factory  # noqa: F401  (fixture)
from tests.netlab.lab import SERVER_PUBLIC_IP, NatLabFactory
from tests.netlab.test_echo_nat import MODES, client, start_server

pytestmark = pytest.mark.netns
REPO = Path(__file__).resolve().parents[2]


def events_of(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def wait_for_hellos(path: Path, sources: set[str], timeout: float = 30.0) -> None:
    """Until the server's events file holds a HELLO event from each of `sources`."""
    deadline = time.monotonic() + timeout
    missing = set(sources)
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        complete = text[: text.rfind("\n") + 1].splitlines()  # the writer may be mid-line
        seen = {
            event.get("source_ip")
            for event in map(json.loads, complete)
            if event.get("event") in ("hello_received", "hello_rejected")
        }
        missing = sources - seen
        if not missing:
            return
        time.sleep(0.05)  # the polling interval of a bounded wait: a file has no change event
    raise AssertionError(f"no HELLO event within {timeout} s from {sorted(missing)}")


def wait_past_eviction_grace(path: Path) -> None:
    """Until the newest duologue of the server's events is older than the eviction grace.

    A never-joined duologue younger than `EVICTION_GRACE` is not evicted (its client may be
    joining right now): a victim whose HELLO came sooner after the flood would be told "server
    full", which is right, but is not the case under test. How soon it comes depends on how
    fast the server handled the flood (the compiled core is faster), so the test lets the grace
    pass from the server's own timestamps instead of depending on that.
    """
    created = [
        datetime.fromisoformat(str(event["ts"]).replace("Z", "+00:00")).timestamp()
        for event in events_of(path)
        if event.get("event") == "duologue_created"
    ]
    if created:
        # A deadline let pass on purpose (the grace), not a synchronisation.
        time.sleep(max(0.0, max(created) + EVICTION_GRACE + 0.05 - time.time()))


def flood(lab, sources: str, rounds: int = 1) -> None:  # type: ignore[no-untyped-def]
    """Forge from the public segment itself: the switch namespace, given an address on its
    bridge, has no NAT that would rewrite the forged sources (a router would masquerade them)."""
    out = subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            lab.switch,
            sys.executable,
            "-m",
            "tests.netlab.spoof",
            "--server",
            SERVER_PUBLIC_IP,
            "--port",
            "9000",
            "--sources",
            sources,
            "--rounds",
            str(rounds),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert int(out.strip()) > 0


def attacker_on_public_segment(lab) -> None:  # type: ignore[no-untyped-def]
    subprocess.run(
        ["ip", "netns", "exec", lab.switch, "ip", "addr", "add", "198.18.0.250/24", "dev", "br0"],
        check=True,
    )


def run_scenario(lab, tmp_path: Path, *extra: str):  # type: ignore[no-untyped-def]
    home = lab.sites[0]
    victim_ip = home.router.public_ip
    attacker_on_public_segment(lab)
    events = tmp_path / "events.jsonl"
    server = start_server(
        lab.server,
        "--max-per-ip",
        "1",
        "--max-clients",
        "8",
        "--duologue-expiry",
        "5",
        "--events",
        str(events),
        *extra,
    )
    try:
        # The attacker, on another network, forges HELLOs from 60 addresses, and 5 from the
        # victim's public address to take its only per-IP slot.
        flood(lab, "198.18.0.100-159")
        flood(lab, victim_ip, rounds=5)
        # The victim comes once the server has handled the flood: a HELLO event (received or
        # rejected) from each of the 60 forged sources. (The forgeries from the victim's own
        # address leave no event of their own to wait for.)
        wait_for_hellos(events, {f"198.18.0.{host}" for host in range(100, 160)})
        if "--no-address-validation" in extra:
            wait_past_eviction_grace(events)
        started = time.monotonic()
        victim = client(home.clients[0], "--count", "3", "--interval", "0", *extra)
        _, err = victim.communicate(timeout=60)
        elapsed = time.monotonic() - started
        print(f"victim connected and echoed 3 times in {elapsed:.2f} s during the flood")
        assert victim.returncode == 0, err
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 0
    return events_of(events), elapsed


@MODES
def test_forged_hellos_are_dropped_and_the_victim_connects_at_once(
    nat_lab_factory: NatLabFactory,  # noqa: F811
    tmp_path: Path,
    ports: str,
) -> None:
    lab = nat_lab_factory(sites=1, clients_per_site=1)
    events, elapsed = run_scenario(lab, tmp_path, "--duologue-ports", ports)
    rejected = [e for e in events if e["event"] == "hello_rejected"]
    assert sum(e["reason"] == "unvalidated address" for e in rejected) >= 60
    created = [e for e in events if e["event"] == "duologue_created"]
    assert len(created) == 1 and created[0]["source_ip"] == lab.sites[0].router.public_ip
    assert elapsed < 2.0 + 1.5  # client start-up included


@MODES
def test_without_validation_spoofed_duologues_expire_and_the_victim_gets_in_before_expiry(
    nat_lab_factory: NatLabFactory,  # noqa: F811
    tmp_path: Path,
    ports: str,
) -> None:
    lab = nat_lab_factory(sites=1, clients_per_site=1)
    events, elapsed = run_scenario(
        lab, tmp_path, "--no-address-validation", "--duologue-ports", ports
    )
    victim_ip = lab.sites[0].router.public_ip
    created = [e for e in events if e["event"] == "duologue_created"]
    spoofed = [e for e in created if e["source_ip"] != victim_ip]
    assert len(spoofed) >= 7  # the forged HELLOs filled the server (max-clients 8)
    # The victim still connected, long before the 5 s expiry, by evicting a never-joined one.
    assert any(e["source_ip"] == victim_ip for e in created[-1:])
    assert elapsed < 2.0 + 1.5
    closed = [e for e in events if e["event"] == "duologue_closed"]
    reasons = {e["reason"] for e in closed}
    assert "evicted" in reasons
    # Every spoofed duologue ended without anyone joining it (expired, evicted or at shutdown).
    connected = {e["duologue_id"] for e in events if e["event"] == "duologue_connected"}
    assert all(e["duologue_id"] not in connected for e in spoofed)
