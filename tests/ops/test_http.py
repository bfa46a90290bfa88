"""The operations HTTP server in-process, over real sockets: what each path and method gets,
what malformed, slow and too many clients get, and that none of it ends the server."""

from __future__ import annotations

from collections.abc import AsyncIterator

import click
import pytest
import trio
import trio.testing
from prometheus_client import Counter
from prometheus_client.parser import text_string_to_metric_families

from echo.ops import http
from echo.ops.cli import MetricsAddress, Ops, bind


async def exchange(port: int, data: bytes, *, half_close: bool = True) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(data)
        if half_close:
            await stream.send_eof()
        chunks = []
        while chunk := await stream.receive_some(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def request(path: str, method: str = "GET", extra: str = "") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nHost: t\r\n{extra}Connection: close\r\n\r\n".encode()


@pytest.fixture
async def ops(nursery: trio.Nursery) -> AsyncIterator[Ops]:
    ops = Ops(bind("127.0.0.1", 0))
    await ops.start(nursery)
    yield ops


async def test_metrics_are_the_registry_in_text_format(ops: Ops) -> None:
    hits = Counter("test_hits", "Hits", registry=ops.registry)
    hits.inc(3)
    answer = await exchange(ops.address[1], request("/metrics"))
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK")
    assert b"content-type: text/plain; version=0.0.4" in head
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    assert families["test_hits"].samples[0].value == 3
    assert families["echo_ready"].samples[0].value == 0  # not ready until told
    assert "process_open_fds" in families


async def test_openmetrics_when_the_scraper_asks_for_it(ops: Ops) -> None:
    accept = "Accept: application/openmetrics-text; version=1.0.0\r\n"
    answer = await exchange(ops.address[1], request("/metrics", extra=accept))
    assert b"content-type: application/openmetrics-text" in answer
    assert answer.endswith(b"# EOF\n")


async def test_readiness_follows_the_life_of_the_server(ops: Ops) -> None:
    port = ops.address[1]
    assert (await exchange(port, request("/readyz"))).startswith(b"HTTP/1.1 503 ")
    assert (await exchange(port, request("/healthz"))).startswith(b"HTTP/1.1 200 ")
    ops.health.ready()
    ready = await exchange(port, request("/readyz"))
    assert ready.startswith(b"HTTP/1.1 200 ") and ready.endswith(b"ready\n")
    ops.health.draining()
    ops.health.ready()  # draining is the end: it never becomes ready again
    draining = await exchange(port, request("/readyz"))
    assert draining.startswith(b"HTTP/1.1 503 ") and draining.endswith(b"draining\n")
    assert (await exchange(port, request("/healthz"))).startswith(b"HTTP/1.1 200 ")


async def test_post_drain_only_where_the_server_offers_it(ops: Ops) -> None:
    port = ops.address[1]
    assert (await exchange(port, request("/drain", "POST"))).startswith(b"HTTP/1.1 404")
    requested = ops.allow_drain()
    ops.health.ready()
    answer = await exchange(port, request("/drain", "GET"))
    assert answer.startswith(b"HTTP/1.1 405") and b"allow: POST" in answer
    assert not requested.is_set() and ops.health.is_ready
    answer = await exchange(port, request("/drain", "POST"))
    assert answer.startswith(b"HTTP/1.1 202 Accepted") and answer.endswith(b"draining\n")
    assert requested.is_set()
    assert (await exchange(port, request("/readyz"))).startswith(b"HTTP/1.1 503")
    # POST elsewhere is still refused
    assert (await exchange(port, request("/metrics", "POST"))).startswith(b"HTTP/1.1 405")


async def test_head_unknown_paths_and_other_methods(ops: Ops) -> None:
    port = ops.address[1]
    head = await exchange(port, request("/metrics", method="HEAD"))
    assert head.startswith(b"HTTP/1.1 200 ") and head.endswith(b"\r\n\r\n")  # no body
    assert (await exchange(port, request("/metricsX"))).startswith(b"HTTP/1.1 404 ")
    assert (await exchange(port, request("/"))).startswith(b"HTTP/1.1 404 ")
    refused = await exchange(port, request("/healthz", method="DELETE"))
    assert refused.startswith(b"HTTP/1.1 405 ") and b"allow: GET, HEAD" in refused
    with_query = await exchange(port, request("/healthz?verbose=1"))
    assert with_query.startswith(b"HTTP/1.1 200 ")


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x00\xff" * 100 + b"\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\r\nno colon here\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\n\r\n",  # no Host
        b"GET /healthz HTTP/1.1\r\nHost: a\r\nContent-Length: x\r\n\r\n",
        b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n",  # over h11's size limit
    ],
)
async def test_malformed_requests_get_400_and_the_server_goes_on(ops: Ops, garbage: bytes) -> None:
    answer = await exchange(ops.address[1], garbage)
    assert answer.startswith(b"HTTP/1.1 4"), answer[:100]
    assert b"connection: close" in answer
    assert ops.http.bad_requests == 1
    assert (await exchange(ops.address[1], request("/healthz"))).startswith(b"HTTP/1.1 200 ")


async def test_a_body_or_a_cut_off_body_closes_the_connection_after_the_answer(ops: Ops) -> None:
    port = ops.address[1]
    posted = await exchange(
        port, b"POST /healthz HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\nabc"
    )
    assert posted.startswith(b"HTTP/1.1 405 ") and posted.count(b"HTTP/1.1") == 1
    sent = await exchange(port, b"GET /healthz HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nab")
    assert sent.startswith(b"HTTP/1.1 200 ") and sent.count(b"HTTP/1.1") == 1
    assert ops.http.connections == 0
    assert (await exchange(port, request("/healthz"))).startswith(b"HTTP/1.1 200 ")


async def test_keep_alive_answers_every_request_in_order(ops: Ops) -> None:
    one = b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n"
    answer = await exchange(ops.address[1], one + one + request("/readyz"))
    assert answer.count(b"HTTP/1.1 200 OK") == 2 and answer.endswith(b"starting\n")
    assert answer.count(b"HTTP/1.1 503 ") == 1


async def test_a_silent_client_is_dropped_after_the_request_timeout(
    ops: Ops, autojump_clock: trio.testing.MockClock
) -> None:
    stream = await trio.open_tcp_stream("127.0.0.1", ops.address[1])
    async with stream:
        await stream.send_all(b"GET /healthz HTTP/1.1\r\n")  # and then nothing
        with trio.fail_after(http.REQUEST_TIMEOUT + 5):
            assert await stream.receive_some(100) == b""
    assert ops.http.connections == 0


async def test_connections_beyond_the_bound_are_closed_at_once(ops: Ops) -> None:
    port = ops.address[1]
    held = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(http.MAX_CONNECTIONS)]
    for stream in held:
        await stream.send_all(b"GET")  # a request begun, keeping its connection
    await trio.testing.wait_all_tasks_blocked()
    assert ops.http.connections == http.MAX_CONNECTIONS
    extra = await trio.open_tcp_stream("127.0.0.1", port)
    async with extra:
        with trio.fail_after(5):
            assert await extra.receive_some(100) == b""
    for stream in held:
        await stream.aclose()
    with trio.fail_after(5):
        while ops.http.connections:  # noqa: ASYNC110 (no event for it)
            await trio.sleep(0.01)
    assert (await exchange(port, request("/healthz"))).startswith(b"HTTP/1.1 200 ")


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("127.0.0.1:9100", ("127.0.0.1", 9100)),
        ("0.0.0.0:0", ("0.0.0.0", 0)),
        ("[::1]:9100", ("::1", 9100)),
        (" [::]:65535 ", ("::", 65535)),
    ],
)
def test_metrics_addresses(text: str, parsed: tuple[str, int]) -> None:
    assert MetricsAddress().convert(text, None, None) == parsed


@pytest.mark.parametrize(
    "text",
    [
        "",
        ":9100",
        "9100",
        "host:9100",
        "127.0.0.1:",
        "127.0.0.1:-1",
        "127.0.0.1:65536",
        "::1:9100",
        "[127.0.0.1]:9100",
        "[::1]9100",
        "127.0.0.1:9100:1",
    ],
)
def test_bad_metrics_addresses(text: str) -> None:
    with pytest.raises(click.BadParameter):
        MetricsAddress().convert(text, None, None)


async def test_a_kept_alive_connection_lives_as_long_as_it_asks_in_time(
    ops: Ops, autojump_clock: trio.testing.MockClock
) -> None:
    stream = await trio.open_tcp_stream("127.0.0.1", ops.address[1])
    async with stream:
        for _ in range(5):  # 5 x 0.8 of the timeout: longer than one timeout in all
            await trio.sleep(http.REQUEST_TIMEOUT * 0.8)
            await stream.send_all(b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n")
            answer = b""
            while not answer.endswith(b"ok\n"):
                answer += await stream.receive_some(65536)
            assert answer.startswith(b"HTTP/1.1 200 OK")
        with trio.fail_after(http.REQUEST_TIMEOUT + 5):
            assert await stream.receive_some(100) == b""  # idle past the timeout: closed


class Broken:
    def collect(self) -> list[object]:
        raise RuntimeError("a collector with a bug")


async def test_a_failing_collector_costs_its_scrape_not_the_server(ops: Ops) -> None:
    ops.register(Broken())  # type: ignore[arg-type]
    answer = await exchange(ops.address[1], request("/metrics"))
    assert answer.startswith(b"HTTP/1.1 500 ")
    assert (await exchange(ops.address[1], request("/healthz"))).startswith(b"HTTP/1.1 200 ")
