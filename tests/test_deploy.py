"""The deployment files open exactly the ports each --duologue-ports mode needs.

The systemd unit (SocketBindAllow) and its per-client drop-in, and the container file (EXPOSE
and its `docker run -p` lines), against what ServerConfig says the server binds.
"""

from __future__ import annotations

import re
from pathlib import Path

from echo.session.config import ServerConfig

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"


def _ports(ranges: list[str]) -> set[int]:
    found: set[int] = set()
    for text in ranges:
        first, _, last = text.partition("-")
        found |= set(range(int(first), int(last or first) + 1))
    return found


def needed(mode: str, max_clients: int = 16) -> set[int]:
    config = ServerConfig(address="0.0.0.0", duologue_ports=mode, max_clients=max_clients)
    return {config.port, config.control_port, *config.clients_port_range}


def test_the_unit_lets_the_shared_server_bind_its_four_ports_and_nothing_else() -> None:
    unit = (DEPLOY / "echo-server.service").read_text()
    assert re.search(r"^SocketBindDeny=any$", unit, re.M)
    allowed = _ports(re.findall(r"^SocketBindAllow=udp:([\d-]+)$", unit, re.M))
    assert allowed == needed("shared") == {9000, 9001, 9010, 9011}
    assert "--duologue-ports ${ECHO_DUOLOGUE_PORTS}" in unit
    assert re.search(r"^Environment=ECHO_DUOLOGUE_PORTS=shared$", unit, re.M)


def test_the_per_client_drop_in_adds_the_per_client_range() -> None:
    unit = (DEPLOY / "echo-server.service").read_text()
    drop_in = (DEPLOY / "echo-server-per-client.conf").read_text()
    allowed = _ports(re.findall(r"^SocketBindAllow=udp:([\d-]+)$", unit + drop_in, re.M))
    (max_clients,) = re.findall(r"--max-clients (\d+)\"$", drop_in, re.M)
    assert allowed == needed("per-client", int(max_clients))
    assert re.search(r"^Environment=ECHO_DUOLOGUE_PORTS=per-client$", drop_in, re.M)


def test_the_container_exposes_the_shared_ports_and_documents_per_client() -> None:
    text = (DEPLOY / "Containerfile").read_text()
    (expose,) = re.findall(r"^EXPOSE (.*)$", text, re.M)
    assert _ports(re.findall(r"([\d-]+)/udp", expose)) == needed("shared")
    runs = re.findall(r"docker run (.*?)echo-server(.*)$", text, re.M)
    shared_run, per_client_run = runs
    assert _ports(re.findall(r"-p ([\d-]+):", shared_run[0])) == needed("shared")
    per_client_args = text.split(per_client_run[1], 1)[1].splitlines()[1]
    (max_clients,) = re.findall(r"--max-clients (\d+)", per_client_args)
    assert "--duologue-ports per-client" in per_client_args
    assert _ports(re.findall(r"-p ([\d-]+):", per_client_run[0])) == needed(
        "per-client", int(max_clients)
    )
