"""Dynamic MDC through a real NAT (docs/architecture.md, Test layers), and the control case that
fails."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.netlab.fixtures import nat_lab_factory  # noqa: F401  (fixture)
from tests.netlab.lab import SERVER_PUBLIC_IP, Host, NatLabFactory

pytestmark = pytest.mark.netns
REPO = Path(__file__).resolve().parents[2]


def start(host: Host, *args: str) -> subprocess.Popen[bytes]:
    return host.python(
        "-m",
        "tests.netlab.programs",
        *args,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def result(process: subprocess.Popen[bytes], timeout: float = 120) -> dict[str, object]:
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, err.decode()
    return json.loads(out.decode().strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_subscriber_behind_nat_gets_every_message_of_a_dynamic_mdc_publication_with_loss(
    nat_lab_factory: NatLabFactory,  # noqa: F811
) -> None:
    lab = nat_lab_factory(sites=1, clients_per_site=1)
    client = lab.sites[0].clients[0]
    client.set_loss(10)
    control = f"{SERVER_PUBLIC_IP}:24001"
    count = 2000
    subscriber = start(
        client,
        "subscribe",
        "--channel",
        f"aeron:udp?control={control}|control-mode=dynamic",
        "--count",
        str(count),
        "--timeout",
        "90",
    )
    publisher = start(
        lab.server,
        "publish",
        "--channel",
        f"aeron:udp?control={control}|control-mode=dynamic|term-length=64k",
        "--count",
        str(count),
        "--size",
        "300",
        "--timeout",
        "20",
    )
    sub = result(subscriber)
    pub = result(publisher)
    assert pub["connected"] and pub["sent"] == count
    assert sub["received"] == count and sub["in_order"]
    # The data came from the server's control port, and the server only ever saw the router.
    assert sub["source"] == f"{SERVER_PUBLIC_IP}:24001"
    destinations = pub["destinations"]
    assert isinstance(destinations, list)
    assert all(d.startswith(lab.sites[0].router.public_ip + ":") for d in destinations)
    counters = sub["counters"]
    assert isinstance(counters, dict) and counters["naks_sent"] > 0  # loss really happened


def test_plain_unicast_to_the_port_a_client_names_does_not_pass_the_nat(
    nat_lab_factory: NatLabFactory,  # noqa: F811
) -> None:
    lab = nat_lab_factory(sites=1, clients_per_site=1)
    client = lab.sites[0].clients[0]
    router = lab.sites[0].router
    subscriber = start(
        client,
        "subscribe",
        "--channel",
        "aeron:udp?endpoint=0.0.0.0:24002",
        "--count",
        "1",
        "--timeout",
        "4",
    )
    # The client "names" port 24002; the server can only aim at the router's public address.
    publisher = start(
        lab.server,
        "publish",
        "--channel",
        f"aeron:udp?endpoint={router.public_ip}:24002",
        "--count",
        "1",
        "--timeout",
        "3",
    )
    pub = result(publisher)
    sub = result(subscriber)
    assert pub["connected"] is False
    assert sub["received"] == 0
    counters = sub["counters"]
    assert isinstance(counters, dict) and counters["setups_received"] == 0
