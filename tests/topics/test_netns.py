"""Topics over real sockets between network namespaces (docs/architecture.md, Test layers).

Five ``echo-topics`` servers on the public segment (198.18.0.11-15), subscribers and a
publisher on other hosts behind NAT routers, a victim on the public segment and an attacker
who forges source addresses from the segment itself.
"""

from __future__ import annotations

import datetime
import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from echo.topics.client import COOKIE_REPLY_SIZE
from echo.topics.codec import format_confirm, format_pad, make_cookie
from tests.netlab.fixtures import nat_lab_factory  # noqa: F401  (fixture)
from tests.netlab.lab import Host, Lab, LineReader, NatLabFactory

pytestmark = pytest.mark.netns
REPO = Path(__file__).resolve().parents[2]
SERVER_IPS = [f"198.18.0.{11 + i}" for i in range(5)]
PORT = 7400
ATTACKER_IP = "198.18.0.250"


def start(host: Host, *args: str) -> tuple[subprocess.Popen[bytes], LineReader]:
    process = host.python(
        "-m", *args, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=sys.stderr
    )
    return process, LineReader(process.stdout)


def start_servers(lab: Lab, tmp_path: Path, *extra: str) -> list[subprocess.Popen[bytes]]:
    server = lab.server
    for ip in SERVER_IPS:
        server.check_output(["ip", "addr", "add", f"{ip}/24", "dev", "eth0"])
    processes = []
    for i, ip in enumerate(SERVER_IPS):
        process = server.python(
            "-m",
            "echo.topics.serve",
            "--address",
            ip,
            "--port",
            str(PORT),
            "--log-format",
            "json",
            "--events",
            str(tmp_path / f"events{i}.jsonl"),
            *extra,
            cwd=REPO,
            stderr=subprocess.PIPE,
        )
        reader = LineReader(process.stderr)
        while '"listening"' not in reader.readline(timeout=30):
            pass
        processes.append(process)
    return processes


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0


def result_of(process: subprocess.Popen[bytes], reader: LineReader) -> dict[str, Any]:
    line = reader.readline(timeout=90)
    assert process.wait(timeout=30) == 0
    result: dict[str, Any] = json.loads(line)
    return result


def events(tmp_path: Path, index: int) -> list[dict[str, Any]]:
    path = tmp_path / f"events{index}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_two_of_five_servers_die_and_every_message_still_arrives_once(
    nat_lab_factory: NatLabFactory,  # noqa: F811
    tmp_path: Path,
) -> None:
    lab = nat_lab_factory(sites=2, clients_per_site=2, prefix="etop")
    servers = start_servers(lab, tmp_path, "--lifetime", "6")
    listed = ",".join(f"{ip}:{PORT}" for ip in SERVER_IPS)
    topics = [f"room/{i}" for i in range(12)]
    per_phase = 8
    expect = len(topics) * per_phase * 2
    try:
        # Three subscribers on three hosts (two sites), the publisher on a fourth.
        subscribers = []
        for host in [*lab.sites[0].clients, lab.sites[1].clients[1]]:
            process, reader = start(
                host,
                "tests.topics.programs",
                "subscriber",
                "--servers",
                listed,
                "--k",
                "3",
                "--topics",
                ",".join(topics),
                "--expect",
                str(expect),
            )
            subscribers.append((process, reader))
        for _, reader in subscribers:
            assert reader.readline(timeout=60) == "ready"
        publisher, pub_reader = start(
            lab.sites[1].clients[0],
            "tests.topics.programs",
            "publisher",
            "--servers",
            listed,
            "--k",
            "3",
            "--topics",
            ",".join(topics),
            "--per-phase",
            str(per_phase),
        )
        assert pub_reader.readline(timeout=60) == "ready"
        assert pub_reader.readline(timeout=60) == "half"
        # Mid-run, two servers die without a word (SIGKILL): every topic has K = 3 servers,
        # so each keeps at least one, shared by publisher and subscribers.
        for victim in (servers[0], servers[2]):
            victim.kill()
            victim.wait(timeout=30)
        assert publisher.stdin is not None
        publisher.stdin.write(b"go\n")
        publisher.stdin.flush()
        published = result_of(publisher, pub_reader)["published"]
        assert len(published) == expect
        for process, reader in subscribers:
            result = result_of(process, reader)
            got = Counter(tuple(m) for m in result["messages"])
            assert got == Counter(tuple(m) for m in published), "missing or repeated"
            counters = result["counters"]
            assert counters["messages_received"] == expect
            # Before the deaths each message came from 3 servers, after from 1 to 3: the
            # copies were dropped by id, and counted.
            assert counters["duplicates"] >= 2 * len(topics) * per_phase
    finally:
        for process in servers:
            if process.poll() is None:
                stop(process)
    # The survivors forwarded the second half; the dead ones never got it.
    delivered = {i: events(tmp_path, i)[-1] for i in (1, 3, 4)}
    assert all(e["event"] == "topics_stopped" for e in delivered.values())
    assert sum(e["deliveries"] for e in delivered.values()) >= 3 * len(topics) * per_phase


def forge(lab: Lab, source: str, server: str, payloads: list[bytes]) -> dict[str, Any]:
    """Send ``payloads`` with the forged ``source`` from the public segment (no NAT there)."""
    out = subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            lab.switch,
            sys.executable,
            "-m",
            "tests.topics.programs",
            "forge",
            "--source",
            source,
            "--server",
            server,
            *[arg for p in payloads for arg in ("--payload", p.hex())],
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    result: dict[str, Any] = json.loads(out)
    return result


def test_forged_subscriptions_get_the_victim_at_most_one_small_datagram_each(
    nat_lab_factory: NatLabFactory,  # noqa: F811
    tmp_path: Path,
) -> None:
    lab = nat_lab_factory(sites=2, clients_per_site=1, prefix="etop")
    servers = start_servers(lab, tmp_path, "--lifetime", "30")
    subprocess.run(
        ["ip", "netns", "exec", lab.switch, "ip", "addr", "add", f"{ATTACKER_IP}/24", "dev", "br0"],
        check=True,
    )
    # The victim is a host on the public segment (a router's own address) listening on a port.
    victim_host = lab.sites[1].router
    victim_address = f"{victim_host.ip}:9999"
    target = f"{SERVER_IPS[0]}:{PORT}"
    topics = [f"hot/{i}" for i in range(30)]
    victim, victim_reader = start(
        victim_host, "tests.topics.programs", "victim", "--ip", victim_host.ip, "--port", "9999"
    )
    assert victim_reader.readline(timeout=30) == "ready"
    try:
        # 1. One forged subscription to 30 topics in the victim's name, padded so that the
        # server does answer it (the worst case): the victim gets one cookie, no larger.
        forged = b"".join(t.encode() + b"\n" for t in topics)
        one = forge(lab, victim_address, target, [forged])
        # 2. Publishes on those topics, from a real publisher: none may reach the victim.
        publisher, pub_reader = start(
            lab.sites[0].clients[0],
            "tests.topics.programs",
            "publisher",
            "--servers",
            target,
            "--k",
            "1",
            "--topics",
            ",".join(topics),
            "--per-phase",
            "3",
        )
        assert pub_reader.readline(timeout=60) == "ready"
        assert pub_reader.readline(timeout=60) == "half"
        assert publisher.stdin is not None
        publisher.stdin.write(b"go\n")
        publisher.stdin.flush()
        result_of(publisher, pub_reader)
        assert victim.stdin is not None
        victim.stdin.close()
        seen = result_of(victim, victim_reader)
        print(f"one forgery of {one['bytes']} B for {len(topics)} topics: the victim got {seen}")
        assert seen["datagrams"] <= 1
        assert all(size <= one["bytes"] for size in seen["sizes"])
    finally:
        for process in servers:
            stop(process)
    final = events(tmp_path, 0)[-1]
    assert final["event"] == "topics_stopped"
    assert final["unconfirmed_subscribes"] == len(topics) and final["subscriptions"] == 0
    assert final["publishes"] == len(topics) * 6 and final["deliveries"] == 0


def test_amplification_for_unconfirmed_sources_is_at_most_one(
    nat_lab_factory: NatLabFactory,  # noqa: F811
    tmp_path: Path,
) -> None:
    lab = nat_lab_factory(sites=1, clients_per_site=1, prefix="etop")
    servers = start_servers(lab, tmp_path, "--work-difficulty", "4")
    subprocess.run(
        ["ip", "netns", "exec", lab.switch, "ip", "addr", "add", f"{ATTACKER_IP}/24", "dev", "br0"],
        check=True,
    )
    victim_host = lab.sites[0].router
    victim_address = f"{victim_host.ip}:9999"
    target = f"{SERVER_IPS[1]}:{PORT}"
    guess = make_cookie(b"a guess", 0, victim_host.ip, 9999)
    # Everything an attacker who cannot read the victim's traffic might send in its name.
    payloads = [
        b"t\n",  # smaller than a cookie: no answer at all
        b"t\n" + format_pad(COOKIE_REPLY_SIZE),  # answered with one cookie
        b"".join(b"topic%d\n" % i for i in range(100)),
        format_confirm(guess, b"ab") + b"t\n",  # a guessed cookie: treated as unconfirmed
        b"t message id1\n" * 50,  # publishes: never answered
        b"!cookie 1.aaaaaaaaaaaaaaaaaaaaaaaa 0\n",
        b"\xff\xfe garbage \x00\n" * 10,
        b"x" * 1400,
    ]
    victim, victim_reader = start(
        victim_host, "tests.topics.programs", "victim", "--ip", victim_host.ip, "--port", "9999"
    )
    assert victim_reader.readline(timeout=30) == "ready"
    try:
        sent = {"bytes": 0}
        for _ in range(5):
            sent["bytes"] += forge(lab, victim_address, target, payloads)["bytes"]
        assert victim.stdin is not None
        victim.stdin.close()
        seen = result_of(victim, victim_reader)
    finally:
        for process in servers:
            stop(process)
    amplification = seen["bytes"] / sent["bytes"]
    print(f"amplification for unconfirmed sources: {amplification:.3f} ({seen} / {sent})")
    assert 0 < seen["datagrams"] <= 5 * 3  # cookies for the padded, 100-topic, guessed ones
    assert amplification <= 1.0
    final = events(tmp_path, 1)[-1]
    assert final["amplification"] <= 1.0 and final["cookies_withheld"] == 5
    assert final["bad_cookies"] == 5 and final["subscriptions"] == 0


def test_a_subscription_lapses_n_seconds_after_its_last_refresh_across_nat(
    nat_lab_factory: NatLabFactory,  # noqa: F811
    tmp_path: Path,
) -> None:
    lab = nat_lab_factory(sites=1, clients_per_site=1, prefix="etop")
    n, m = 3.0, 3.0
    servers = start_servers(lab, tmp_path, "--lifetime", str(n))
    try:
        sub, reader = start(
            lab.sites[0].clients[0],
            "tests.topics.programs",
            "subscriber",
            "--servers",
            f"{SERVER_IPS[0]}:{PORT}",
            "--k",
            "1",
            "--topics",
            "presence/7",
            "--hold",
            "--lifetime",
            str(n),
            "--refresh-factor",
            str(m),
        )
        assert reader.readline(timeout=60) == "ready"
        # Refreshed every N/M = 1 s through the NAT for a while: still subscribed after 2 N.
        # (Deliberately letting two lifetimes pass: what is tested is that nothing expires.)
        time.sleep(2 * n)
        kinds = [e["event"] for e in events(tmp_path, 0)]
        assert "subscription_added" in kinds and "subscription_expired" not in kinds
        assert sub.stdin is not None
        sub.stdin.write(b"stop\n")
        sub.stdin.flush()
        stopped_at = result_of(sub, reader)["stopped_at"]
        deadline = time.monotonic() + 3 * n
        while time.monotonic() < deadline:
            expired = [e for e in events(tmp_path, 0) if e["event"] == "subscription_expired"]
            if expired:
                break
            time.sleep(0.1)
        else:
            raise AssertionError("the subscription never lapsed")
    finally:
        for process in servers:
            stop(process)
    lapsed_at = datetime.datetime.fromisoformat(expired[0]["ts"]).timestamp()
    # The last refresh went out at most N/M before the stop: the lapse comes N after it.
    print(f"lapsed {lapsed_at - stopped_at:.2f} s after the last chance to refresh (N = {n})")
    assert n - n / m - 0.2 <= lapsed_at - stopped_at <= n + 0.5
