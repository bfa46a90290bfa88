"""The two-namespace lab of the loss benchmark: one veth link, per-datagram packets, cleanup."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.netlab.lab import REGISTRY_DIR, Host, list_namespaces, pair_lab

pytestmark = pytest.mark.netns

# A UDP GSO send (UDP_SEGMENT, linux/udp.h): one sendmsg of 4 x 100 bytes becomes 4 datagrams.
_GSO_SEND = """
import socket, sys
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sock.setsockopt(socket.IPPROTO_UDP, 103, 100)
sock.sendto(b"x" * 400, (sys.argv[1], 9))
"""


def _count_udp_on_input(host: Host) -> None:
    host.check_output(["nft", "add", "table", "inet", "probe"])
    host.check_output(
        [
            "nft",
            "add chain inet probe inp { type filter hook input priority filter - 20; }",
        ]
    )
    host.check_output(["nft", "add", "rule", "inet", "probe", "inp", "meta l4proto udp counter"])


def _udp_packets_seen(host: Host) -> int:
    listing = json.loads(host.check_output(["nft", "-j", "list", "table", "inet", "probe"]))
    counters = [
        statement["counter"]["packets"]
        for item in listing["nftables"]
        if "rule" in item
        for statement in item["rule"]["expr"]
        if "counter" in statement
    ]
    assert len(counters) == 1
    return int(counters[0])


def _gso_send(lab_a: Host, to: str) -> None:
    lab_a.check_output([sys.executable, "-c", _GSO_SEND, to])


def test_a_gso_batch_crosses_the_veth_as_separate_packets() -> None:
    with pair_lab() as lab:
        _count_udp_on_input(lab.b)
        _gso_send(lab.a, lab.b.ip)
        segmented = _udp_packets_seen(lab.b)
        # Control: without gso_max_segs 1 the batch is one packet at the hook, so one nft drop
        # would lose all four datagrams together.
        lab.a.check_output(["ip", "link", "set", "dev", "eth0", "gso_max_segs", "65535"])
        _gso_send(lab.a, lab.b.ip)
        together = _udp_packets_seen(lab.b) - segmented
        details = lab.a.check_output(["ip", "-d", "link", "show", "dev", "eth0"])
        peer = lab.b.check_output(["ip", "-d", "link", "show", "dev", "eth0"])

    assert segmented == 4
    assert together == 1
    assert "gso_max_segs 65535" in details
    assert "gso_max_segs 1 " in peer


def test_pair_lab_leaves_nothing_behind() -> None:
    with pair_lab() as lab:
        names = lab.namespaces()
        registry = REGISTRY_DIR / f"{lab.lab_id}.json"
        assert set(names) <= set(list_namespaces())
        assert registry.exists()
        blocker = lab.b.python("-c", "import sys; sys.stdin.read()", stdin=subprocess.PIPE)
        lab.b.set_loss(5)
        assert lab.b.loss_counters() == {"seen": 0, "dropped": 0}
    assert not set(names) & set(list_namespaces())
    assert not registry.exists()
    assert blocker.poll() is not None
