"""The netns lab is real: NAT rewrites sources, blocks unsolicited traffic, loses packets on demand,
and leaves nothing behind (docs/architecture.md, Test layers)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from tests.netlab.fixtures import nat_lab_factory  # noqa: F401  (fixture)
from tests.netlab.lab import (
    REGISTRY_DIR,
    Host,
    NatLabFactory,
    NetLabUnavailable,
    list_namespaces,
    nat_lab,
    sweep_stale_labs,
)
from tests.netlab.udp_probe import ProbeServer, client_result, start_client

pytestmark = pytest.mark.netns

SERVER_PORT = 9000
CLIENT_PORT = 40000
REPO_ROOT = Path(__file__).resolve().parents[2]


def _server_spec(host: Host, expect: int, actions: list[dict[str, object]]) -> dict[str, object]:
    return {"ip": host.ip, "port": SERVER_PORT, "expect": expect, "actions": actions}


def _client_spec(
    client: Host, server: Host, *, send: str, until: str = "reply", linger: float = 0.3
) -> dict[str, object]:
    return {
        "ip": client.ip,
        "port": CLIENT_PORT,
        "server": [server.ip, SERVER_PORT],
        "send": send,
        "until": until,
        "linger": linger,
    }


def test_nat_rewrites_source_and_reply_reaches_client() -> None:
    with nat_lab() as lab:
        client = lab.sites[0].clients[0]
        server = ProbeServer(
            lab.server,
            _server_spec(lab.server, 1, [{"to": "src", "data": "reply"}]),
        )
        out = client_result(start_client(client, _client_spec(client, lab.server, send="hello")))
        seen = server.result()["seen"]

    assert out["bound"] == CLIENT_PORT
    assert len(seen) == 1
    assert seen[0]["data"] == "hello"
    src_ip, src_port = seen[0]["src"]
    # The server sees the router, never the private address ...
    assert src_ip == lab.sites[0].router.public_ip == client.public_ip
    assert src_ip != client.ip
    # ... and `masquerade random` picked a new source port.
    assert src_port != CLIENT_PORT
    # The answer to that translated address is let back in and reaches the client.
    assert out["received"] == ["reply"]
    assert not out["timed_out"]


def test_server_cannot_reach_client_unsolicited() -> None:
    with nat_lab() as lab:
        client = lab.sites[0].clients[0]
        router = lab.sites[0].router
        actions: list[dict[str, object]] = [
            # No route to the private network from the public side.
            {"to": [client.ip, CLIENT_PORT], "data": "to-private-ip"},
            # The port the client bound, at the router: no mapping exists for it.
            {"sock": "other", "to": [router.public_ip, CLIENT_PORT], "data": "named-port"},
            {"to": [router.public_ip, CLIENT_PORT], "data": "named-port-main"},
            # The real mapping but from another server port: not an answer to the client's flow.
            {"sock": "other", "to": "src", "data": "mapped-port-other-source"},
            # Sent last on the same path: once it arrives, the earlier ones would have too.
            {"to": "src", "data": "reply"},
        ]
        server = ProbeServer(lab.server, _server_spec(lab.server, 1, actions))
        out = client_result(start_client(client, _client_spec(client, lab.server, send="hello")))
        result = server.result()

    assert result["results"][0] == errno.ENETUNREACH
    assert result["results"][1:] == [None, None, None, None]
    assert result["seen"][0]["src"][1] != CLIENT_PORT
    assert out["received"] == ["reply"]


def test_router_forward_policy_drops_new_inbound_even_with_a_route() -> None:
    with nat_lab() as lab:
        client = lab.sites[0].clients[0]
        router = lab.sites[0].router
        # Give the server the route it lacks: now only the router's forward chain stands between
        # the server and the client's private address.
        lab.server.check_output(["ip", "route", "add", "10.77.0.0/16", "via", router.public_ip])
        actions: list[dict[str, object]] = [
            {"to": [client.ip, CLIENT_PORT], "data": "to-private-ip"},
            {"to": "src", "data": "reply"},
        ]
        server = ProbeServer(lab.server, _server_spec(lab.server, 1, actions))
        out = client_result(start_client(client, _client_spec(client, lab.server, send="hello")))
        result = server.result()

    assert result["results"] == [None, None]  # sent: the loss happens in the router
    assert out["received"] == ["reply"]


def test_public_addresses_per_site() -> None:
    with nat_lab(sites=2, clients_per_site=2) as lab:
        clients = lab.clients()
        actions = [{"to": "src", "of": i, "data": "reply"} for i in range(len(clients))]
        server = ProbeServer(lab.server, _server_spec(lab.server, len(clients), actions))
        procs = [
            start_client(c, _client_spec(c, lab.server, send=c.name, linger=0.1)) for c in clients
        ]
        outs = [client_result(p) for p in procs]
        seen = {s["data"]: tuple(s["src"]) for s in server.result()["seen"]}

    assert all(o["received"] == ["reply"] for o in outs)
    assert set(seen) == {c.name for c in clients}
    site1, site2 = lab.sites
    a, b = (seen[c.name] for c in site1.clients)
    c, d = (seen[c.name] for c in site2.clients)
    # Same router, same public IP; both bound CLIENT_PORT, so the NAT must tell them apart by port.
    assert a[0] == b[0] == site1.router.public_ip
    assert c[0] == d[0] == site2.router.public_ip
    assert site1.router.public_ip != site2.router.public_ip
    assert a[1] != b[1] and c[1] != d[1]
    assert CLIENT_PORT not in {a[1], b[1], c[1], d[1]}


def _burst_received(lab_client: Host, server_host: Host, count: int, requests: int = 1) -> int:
    """The server answers one datagram with ``count`` datagrams; how many reach the client."""
    actions: list[dict[str, object]] = [
        {"to": "src", "data": "d", "repeat": count},
        # 20 end markers: at 30-50 % loss the chance that all are lost is < 1e-6.
        {"to": "src", "data": "end", "repeat": 20},
    ]
    server = ProbeServer(server_host, _server_spec(server_host, 1, actions))
    spec = _client_spec(lab_client, server_host, send="go", until="end", linger=0.2)
    spec["send_repeat"] = requests
    out = client_result(start_client(lab_client, spec))
    assert server.result()["results"] == [None, None]
    assert not out["timed_out"]
    return sum(1 for data in out["received"] if data == "d")


def test_set_loss_drops_incoming_udp_and_zero_restores() -> None:
    with nat_lab() as lab:
        client = lab.sites[0].clients[0]
        # Control first: without loss every datagram of the burst arrives (so drops below are the
        # nft rule's, not socket-buffer or backlog overflow).
        assert _burst_received(client, lab.server, 1000) == 1000
        assert client.loss_counters() == {"seen": 0, "dropped": 0}
        client.set_loss(30)
        assert "numgen random mod 10000 < 3000 counter" in client.check_output(
            ["nft", "list", "table", "inet", "lossy"]
        )
        lossy = _burst_received(client, lab.server, 1000)
        counted = client.loss_counters()
        client.set_loss(0)
        tables = client.check_output(["nft", "list", "tables"])
        restored = _burst_received(client, lab.server, 1000)

    assert 150 <= 1000 - lossy <= 450, lossy
    # The rule's counters: the burst and its 20 end markers crossed the hook; every burst
    # datagram that did not arrive was the rule's drop.
    assert counted["seen"] >= 1000
    assert 1000 - lossy <= counted["dropped"] <= 1000 - lossy + 20, counted
    assert "lossy" not in tables
    assert restored == 1000


def test_forwarded_loss_on_router() -> None:
    with nat_lab() as lab:
        client = lab.sites[0].clients[0]
        router = lab.sites[0].router
        router.set_loss(50, forwarded=True)
        # The request crosses the lossy router too: 20 copies, all lost with chance ~1e-6 (the
        # server acts on the first that arrives; the rest wait unread in its socket).
        received = _burst_received(client, lab.server, 1000, requests=20)
        router.set_loss(0)
        restored = _burst_received(client, lab.server, 1000)

    assert 350 <= 1000 - received <= 650, received
    assert restored == 1000


def _root_links() -> set[str]:
    out = subprocess.run(
        ["ip", "-o", "link", "show"], capture_output=True, text=True, check=True
    ).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines()}


class _Boom(Exception):
    pass


@pytest.mark.parametrize("fail", [False, True], ids=["normal-exit", "exception"])
def test_cleanup_removes_everything(fail: bool) -> None:
    links_before = _root_links()
    names: list[str] = []
    with pytest.raises(_Boom) if fail else contextlib.nullcontext():
        with nat_lab(sites=2, clients_per_site=2) as lab:
            names = lab.namespaces()
            registry = REGISTRY_DIR / f"{lab.lab_id}.json"
            assert set(names) <= set(list_namespaces())
            assert registry.exists()
            assert all(len(n) <= 15 for n in names)
            # Something still running inside must not keep the lab alive.
            blocker = (
                lab.sites[1]
                .clients[1]
                .python("-c", "import sys; sys.stdin.read()", stdin=subprocess.PIPE)
            )
            assert blocker.poll() is None
            # Every veth lives inside lab namespaces: the root namespace gains none.
            assert _root_links() == links_before
            if fail:
                raise _Boom
    assert names
    assert not set(names) & set(list_namespaces())
    assert not registry.exists()
    assert blocker.poll() is not None
    assert blocker.stdin is not None
    blocker.stdin.close()
    assert _root_links() == links_before


def test_sweeper_removes_crashed_labs_only() -> None:
    prefix = "enlz"
    # A "crashed run": a child process builds a lab and exits without any cleanup.
    crash = (
        "import json, os\n"
        "from tests.netlab.lab import nat_lab\n"
        # Keep the context manager referenced: collecting it would run its cleanup.
        f"cm = nat_lab(prefix={prefix!r})\n"
        "lab = cm.__enter__()\n"
        "print(json.dumps(lab.namespaces()), flush=True)\n"
        "os._exit(0)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", crash], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    crashed = json.loads(out.stdout)
    assert set(crashed) <= set(list_namespaces())
    crashed_id = crashed[0].split("-")[0]
    # A lab whose registered pid is alive but was started at a different time: a reused pid.
    reused_id = f"{prefix}reus"
    reused_ns = f"{reused_id}-s"
    subprocess.run(["ip", "netns", "add", reused_ns], check=True)
    (REGISTRY_DIR / f"{reused_id}.json").write_text(
        json.dumps({"lab": reused_id, "pid": os.getpid(), "pid_start": -1})
    )
    try:
        # Entering a new lab sweeps the stale ones but keeps itself.
        with nat_lab(prefix=prefix) as live:
            present = set(list_namespaces())
            assert not set(crashed) & present
            assert reused_ns not in present
            assert not (REGISTRY_DIR / f"{crashed_id}.json").exists()
            assert not (REGISTRY_DIR / f"{reused_id}.json").exists()
            # A later sweep (e.g. by a parallel run) leaves a live lab alone.
            assert sweep_stale_labs(prefix) == []
            assert set(live.namespaces()) <= set(list_namespaces())
    finally:
        sweep_stale_labs(prefix)
        if reused_ns in list_namespaces():
            subprocess.run(["ip", "netns", "delete", reused_ns], check=False)


def test_unavailable_is_an_error_not_a_skip(monkeypatch: pytest.MonkeyPatch) -> None:
    before = set(list_namespaces())
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(NetLabUnavailable, match="root"):
        with nat_lab():
            pass
    assert set(list_namespaces()) == before


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError, match="prefix"):
        with nat_lab(prefix="Bad-Prefix"):
            pass
    with pytest.raises(ValueError, match="15 characters"):
        with nat_lab(prefix="abcdef", sites=99, clients_per_site=99):
            pass


async def test_factory_fixture_from_a_trio_test(
    nat_lab_factory: NatLabFactory,  # noqa: F811
) -> None:
    # Later tests drive lab processes from trio; Host.argv wraps commands for trio.run_process.
    lab = nat_lab_factory(sites=1, clients_per_site=1)
    client = lab.sites[0].clients[0]
    result = await trio.run_process(
        client.argv(["ip", "-4", "-o", "route", "show", "default"]), capture_stdout=True
    )
    assert f"default via {lab.sites[0].lan_ip}" in result.stdout.decode()
    names = lab.namespaces()
    assert set(names) <= set(list_namespaces())
