"""Scraping a server's operations endpoint over a real socket, for the tests."""

from __future__ import annotations

import http.client
import socket
import time
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def free_tcp_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get(port: int, path: str, method: str = "GET") -> tuple[int, str]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request(method, path)
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


def scrape(port: int) -> Samples:
    """Every sample of /metrics, parsed by the client library's own parser."""
    status, body = get(port, "/metrics")
    assert status == 200, body
    samples: Samples = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    assert key in samples, f"{name}{labels} not exported"
    return samples[key]


def scrape_until(port: int, predicate: Callable[[Samples], bool], timeout: float = 30) -> Samples:
    """Scrape until the samples show what the traffic implies (a state change the server
    makes when a packet arrives or a timer fires, which a test cannot await in-process)."""
    deadline = time.monotonic() + timeout
    while True:
        samples = scrape(port)
        if predicate(samples):
            return samples
        assert time.monotonic() < deadline, "metrics never showed it"
        time.sleep(0.05)  # another process's file or port: nothing to await


def raw_exchange(port: int, data: bytes) -> bytes:
    """Send `data` as is, end the sending side, and read until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)
