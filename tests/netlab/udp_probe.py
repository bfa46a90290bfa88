"""Plain-socket UDP probes run inside lab namespaces (``host.python("-c", SERVER, spec)``).

They are code strings, not imports, so that they run with nothing but the standard library in the
namespace, and so that tests see exactly what a plain UDP application sees through the NAT.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

from tests.netlab.lab import Host, LineReader

# argv[1] = JSON spec:
#   ip, port: where to listen (a second socket, "other", listens on port + 1)
#   expect: how many datagrams to receive before acting; timeout: seconds per receive
#   actions: [{sock: "main"|"other", to: [ip, port] | "src", of: index into seen, data, repeat}]
# Prints "ready" once bound, then one JSON line {seen: [{data, src}], results: [errno|None]}.
SERVER = r"""
import json, socket, sys
spec = json.loads(sys.argv[1])
main = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
main.bind((spec["ip"], spec["port"]))
other = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
other.bind((spec["ip"], spec["port"] + 1))
main.settimeout(spec.get("timeout", 20))
print("ready", flush=True)
seen = []
for _ in range(spec["expect"]):
    data, src = main.recvfrom(65536)
    seen.append({"data": data.decode(), "src": list(src)})
results = []
for action in spec.get("actions", []):
    sock = main if action.get("sock", "main") == "main" else other
    to = action["to"]
    to = tuple(seen[action.get("of", 0)]["src"]) if to == "src" else tuple(to)
    result = None
    for _ in range(action.get("repeat", 1)):
        try:
            sock.sendto(action["data"].encode(), to)
        except OSError as exc:
            result = exc.errno
            break
    results.append(result)
print(json.dumps({"seen": seen, "results": results}), flush=True)
"""

# argv[1] = JSON spec:
#   ip, port: where to bind (port 0 = ephemeral); server: [ip, port]; send: payload, sent
#   send_repeat times (default 1)
#   until: stop after receiving this payload; linger: then keep receiving this long for
#   stragglers; timeout: overall seconds.
# Prints one JSON line {bound: port, received: [payloads in order], timed_out: bool}.
CLIENT = r"""
import json, socket, sys, time
spec = json.loads(sys.argv[1])
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
# A burst of 1000 datagrams must not overflow the default ~200 KiB receive buffer: overflow
# drops would be indistinguishable from the network loss being measured.
sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
sock.bind((spec["ip"], spec["port"]))
for _ in range(spec.get("send_repeat", 1)):
    sock.sendto(spec["send"].encode(), tuple(spec["server"]))
received = []
deadline = time.monotonic() + spec.get("timeout", 20)
timed_out = False
while True:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        timed_out = True
        break
    sock.settimeout(remaining)
    try:
        data = sock.recv(65536).decode()
    except TimeoutError:
        timed_out = True
        break
    received.append(data)
    if data == spec["until"]:
        break
if not timed_out:
    sock.settimeout(spec.get("linger", 0.3))
    try:
        while True:
            received.append(sock.recv(65536).decode())
    except TimeoutError:
        pass
print(json.dumps({"bound": sock.getsockname()[1], "received": received, "timed_out": timed_out}))
"""


class ProbeServer:
    """A running SERVER probe; construction returns once its sockets are bound."""

    def __init__(self, host: Host, spec: dict[str, Any], *, timeout: float = 20) -> None:
        self.proc = host.python(
            "-c", SERVER, json.dumps(spec), stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        self._lines = LineReader(self.proc.stdout)
        self._timeout = timeout
        ready = self._read()
        assert ready == "ready", ready

    def _read(self) -> str:
        try:
            return self._lines.readline(self._timeout)
        except (EOFError, TimeoutError) as exc:
            self.proc.kill()
            _, err = self.proc.communicate()
            raise AssertionError(f"server probe failed: {exc}; stderr: {err.decode()}") from exc

    def result(self) -> dict[str, Any]:
        line = self._read()
        self.proc.wait(timeout=self._timeout)
        result: dict[str, Any] = json.loads(line)
        return result


def start_client(host: Host, spec: dict[str, Any]) -> subprocess.Popen[bytes]:
    return host.python(
        "-c", CLIENT, json.dumps(spec), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def client_result(proc: subprocess.Popen[bytes], timeout: float = 30) -> dict[str, Any]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err.decode()
    result: dict[str, Any] = json.loads(out)
    return result
