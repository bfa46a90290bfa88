"""Resume across a NAT mapping change, in the NAT lab.

A client behind the lab's NAT router (masquerade random) runs a numbered request/ack protocol
over a resumable session, on per-client duologue ports and on shared ones (where the server
answers the client's new request stream with a new response publication). Mid-session the
router's NAT is moved to another port range and its conntrack table flushed, so the client's
packets leave from new public ports: the server keeps answering the old mapping, which the
router now drops. The client's sender stops hearing status messages, resumes with its secret
from the new path, and goes on. The test asserts that the server saw the same session (one
application call, same session id) from a new peer address, that every request arrived exactly
once, in order, and every ack came back; and that another client behind the same NAT, asking for
that session with a forged proof meanwhile, was refused.

The programs the namespaces run are in this module: ``python -m tests.netlab.test_resume_nat
server|client|thief ...``; each prints JSON lines.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

import pytest
import structlog
import trio

from tests.netlab.fixtures import nat_lab_factory  # noqa: F401  (fixture)
from tests.netlab.lab import _NAT_TABLE, _ROUTER_WAN, SERVER_PUBLIC_IP, Host, NatLabFactory

pytestmark = pytest.mark.netns
REPO = Path(__file__).resolve().parents[2]
PORT = 9000
REQUESTS = 40
FIRST_RANGE = (40000, 40999)
SECOND_RANGE = (50000, 50999)


# ---------------------------------------------------------------- programs (in the namespaces)


def _print(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


async def serve(address: str, duologue_ports: str) -> None:
    import echo.session as es

    async def app(session: es.Session) -> None:
        _print(event="app_started", session=session.session_id, peer=list(session.peer))
        async for data in session:
            _print(
                event="request",
                session=session.session_id,
                n=int(data),
                peer=list(session.peer),
                resumes=session.counters.resumes,
            )
            await session.send(b"ack " + data)

    config = es.ServerConfig(
        address=address,
        port=PORT,
        control_port=PORT + 1,
        clients_base_port=PORT + 10,
        duologue_ports=duologue_ports,
    )
    server = es.SessionServer(config, app)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        _print(event="listening")
        with trio.open_signal_receiver(signal.SIGTERM) as signals:
            async for _ in signals:
                break
        _print(event="summary", resumes=server.resumes, resumes_refused=server.resumes_refused)
        await server.stop()


async def run_client(server: str, requests: int, interval: float, duologue_ports: str) -> None:
    import echo.session as es

    acks: list[int] = []
    async with es.connect(
        server, PORT, PORT + 1, timeout=10, duologue_ports=duologue_ports
    ) as session:
        _print(event="opened", session=session.session_id)
        for n in range(requests):
            await session.send(b"%d" % n)
            reply = await session.receive()
            acks.append(int(reply.split()[1]))
            _print(event="ack", n=acks[-1], resumes=session.counters.resumes)
            await trio.sleep(interval)
        _print(event="done", acks=acks, resumes=session.counters.resumes)


async def steal(server: str, session_id: int) -> None:
    """Ask for `session_id` with a proof made of random bytes, as another client would."""
    from echo.protocol import ECHO_STREAM_ID
    from echo.session.resume import Resume, format_resume, parse_server_reply_untrusted
    from echo.transport import TransportConfig, open_transport

    async with open_transport(TransportConfig()) as transport:
        sub = await transport.add_subscription(
            f"aeron:udp?control={server}:{PORT + 1}|control-mode=dynamic", ECHO_STREAM_ID
        )
        pub = await transport.add_publication(f"aeron:udp?endpoint={server}:{PORT}", ECHO_STREAM_ID)
        await pub.wait_connected(timeout=10)
        with trio.fail_after(10):
            while not sub.images:
                await sub.wait_activity()
        await pub.send(format_resume(Resume(session_id, 1, 0, secrets.token_bytes(16))))
        prefix = f"{pub.session_id} ".encode()
        with trio.fail_after(10):
            async for message in sub:
                if message.data.startswith(prefix):
                    _print(event="reply", reply=repr(parse_server_reply_untrusted(message.data)))
                    return


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=("server", "client", "thief"))
    parser.add_argument("--address", default=SERVER_PUBLIC_IP)
    parser.add_argument("--requests", type=int, default=REQUESTS)
    parser.add_argument("--interval", type=float, default=0.25)
    parser.add_argument("--session", type=int, default=0)
    parser.add_argument("--duologue-ports", default="per-client")
    args = parser.parse_args()
    # The library's log lines go to stderr (the test's log file); stdout is for the JSON facts.
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    if args.role == "server":
        trio.run(serve, args.address, args.duologue_ports)
    elif args.role == "client":
        trio.run(run_client, args.address, args.requests, args.interval, args.duologue_ports)
    else:
        trio.run(steal, args.address, args.session)


# ---------------------------------------------------------------- the router


def set_port_range(router: Host, ports: tuple[int, int]) -> None:
    """Masquerade to this range of public ports from now on (for new mappings)."""
    low, high = ports
    router.check_output(["nft", "flush", "chain", "inet", _NAT_TABLE, "postrouting"])
    router.check_output(
        ["nft", "add", "rule", "inet", _NAT_TABLE, "postrouting", "oifname", _ROUTER_WAN,
         "meta", "l4proto", "udp", "masquerade", "to", f":{low}-{high}", "random"]
    )  # fmt: skip


_FLUSH_CONNTRACK = """
import socket, struct
# ctnetlink IPCTNL_MSG_CT_DELETE with no attributes: delete every IPv4 entry (conntrack -F).
s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 12)
s.bind((0, 0))
body = struct.pack("=BBH", socket.AF_INET, 0, 0)
s.send(struct.pack("=IHHII", 16 + len(body), (1 << 8) | 2, 0x1 | 0x4, 1, 0) + body)
reply = s.recv(4096)
assert struct.unpack_from("=H", reply, 4)[0] == 2 and struct.unpack_from("=i", reply, 16)[0] == 0
"""


def flush_conntrack(router: Host) -> None:
    router.check_output([sys.executable, "-c", _FLUSH_CONNTRACK])


# ---------------------------------------------------------------- the test


class Lines:
    """JSON lines of a process, read with a bound."""

    def __init__(self, process: subprocess.Popen[bytes], log: Path | None = None) -> None:
        assert process.stdout is not None
        self.log = log
        self.stream: IO[bytes] = process.stdout
        self.process = process
        self.seen: list[dict[str, Any]] = []

    def until(self, event: str, **match: Any) -> dict[str, Any]:
        for raw in self.stream:
            try:
                line = json.loads(raw)
            except ValueError:
                continue  # a log line of the library
            self.seen.append(line)
            if line.get("event") == event and all(line.get(k) == v for k, v in match.items()):
                return line
        raise AssertionError(
            f"no {event} {match}; exit {self.process.wait()}; saw {self.seen}; stderr "
            f"{self.log.read_text()[-3000:] if self.log else ''}"
        )


def _program(host: Host, *args: str, log: Path) -> subprocess.Popen[bytes]:
    return host.python(
        "-m",
        "tests.netlab.test_resume_nat",
        *args,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=log.open("wb"),
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def _in_range(port: int, ports: tuple[int, int]) -> bool:
    return ports[0] <= port <= ports[1]


@pytest.mark.parametrize("duologue_ports", ["per-client", "shared"])
def test_a_session_survives_a_nat_mapping_change_and_nobody_else_can_take_it(
    nat_lab_factory: NatLabFactory,  # noqa: F811
    tmp_path: Path,
    duologue_ports: str,
) -> None:
    lab = nat_lab_factory(sites=1, clients_per_site=2)
    site = lab.sites[0]
    set_port_range(site.router, FIRST_RANGE)
    mode = ("--duologue-ports", duologue_ports)
    server = _program(lab.server, "server", *mode, log=tmp_path / "server.log")
    server_lines = Lines(server, tmp_path / "server.log")
    server_lines.until("listening")
    client = _program(site.clients[0], "client", *mode, log=tmp_path / "client.log")
    client_lines = Lines(client, tmp_path / "client.log")
    try:
        opened = client_lines.until("opened")
        session_id = opened["session"]
        before = server_lines.until("request", n=4)
        assert before["session"] == session_id and _in_range(before["peer"][1], FIRST_RANGE)
        # Mid-session the mapping moves: new public ports for every flow from now on.
        set_port_range(site.router, SECOND_RANGE)
        flush_conntrack(site.router)
        # Meanwhile another client behind the same NAT asks for that session.
        log = tmp_path / "thief.log"
        thief = _program(site.clients[1], "thief", "--session", str(session_id), log=log)
        reply = Lines(thief, log).until("reply")
        assert "resume refused" in reply["reply"], reply
        assert thief.wait(timeout=30) == 0
        done = client_lines.until("done")
        assert client.wait(timeout=60) == 0
        server.send_signal(signal.SIGTERM)
        summary = server_lines.until("summary")
        assert server.wait(timeout=30) == 0
    finally:
        for process in (client, server):
            if process.poll() is None:
                process.kill()
    # Every ack came back, once, in order; the client resumed (by itself) at least once.
    assert done["acks"] == list(range(REQUESTS))
    assert done["resumes"] >= 1
    # The server: one application call, the same session id throughout, each request exactly
    # once and in order, first from the old mapping and at the end from a new one.
    lines = server_lines.seen
    assert [line["session"] for line in lines if line["event"] == "app_started"] == [session_id]
    requests = [line for line in lines if line["event"] == "request"]
    assert [line["n"] for line in requests] == list(range(REQUESTS))
    assert {line["session"] for line in requests} == {session_id}
    last = requests[-1]
    assert last["peer"][0] == site.router.public_ip
    assert _in_range(last["peer"][1], SECOND_RANGE), last
    assert last["resumes"] >= 1
    assert summary["resumes"] >= 1 and summary["resumes_refused"] >= 1


if __name__ == "__main__":
    main()
