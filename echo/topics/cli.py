"""`echo-topics` (the server) and `echo-topic subscribe|publish` (the client)."""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import sys
from collections.abc import Sequence
from typing import Any

import click
import structlog
import trio

from echo._cli import (
    EXIT_FAILURE,
    address_option,
    check_resolvable,
    count_option,
    events_option,
    fail,
    log_options,
    one_line,
    port_option,
    sole_error,
)
from echo.ops.cli import Ops, metrics_option, open_ops
from echo.ops.heap import trim_heap
from echo.ops.memdebug import probe_from_environment, serve_probe
from echo.ops.metrics import TopicsCollector
from echo.topics.client import (
    ClientConfig,
    Message,
    open_topic_client,
    parse_servers,
    read_servers_file,
    split_server,
)
from echo.topics.codec import MAX_FIELD, CodecError, encode, format_publish, new_message_id
from echo.topics.driver import TopicServer
from echo.topics.events import TopicEvents
from echo.topics.server import ServerConfig

DEFAULT_PORT = 7400

SERVER_EPILOG = """\b
Clients: echo-topic subscribe --servers ADDRESS:PORT TOPIC
         echo-topic publish --servers ADDRESS:PORT TOPIC MESSAGE
Open --port (UDP) in your firewall. Run the same on several hosts and give every client the
list: each topic lives on K of them (consistent hashing).
SIGINT or SIGTERM: exit 0 (subscriptions are soft state; clients move on by themselves).
\b
Exit status: 0 stopped by a signal; 1 a port in use, an address not on this host or an
--events file that cannot be opened; 2 a bad command line (including an --events file in a
missing directory).
"""


@click.command(epilog=SERVER_EPILOG)
@address_option(help="Local IP address to bind (0.0.0.0 for every IPv4 address of a public host).")
@port_option(
    "--port",
    default=DEFAULT_PORT,
    any_port=True,
    help="UDP port for subscribes and publishes (0: any free port, printed at start).",
)
@click.option(
    "--lifetime",
    "-N",
    default=30.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="N: seconds a subscription lives after its last refresh (clients refresh every N/M).",
)
@count_option(
    "--table-size",
    default=0,
    help="Fixed-size FIFO subscriber table (the soft-state note's variant): when it is full "
    "the oldest subscription is evicted, and confirmations tell clients the estimated "
    "lifetime. 0: off, subscriptions live N seconds.",
)
@click.option(
    "--work-difficulty",
    default=0,
    show_default=True,
    type=click.IntRange(0, 40),
    help="Proof of work a subscriber must do per cookie: leading zero bits of SHA-256 "
    "(about 2**D hashes). 0: none.",
)
@click.option(
    "--rate-limit",
    default=2000.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Datagrams per second accepted from one source address (0: no limit).",
)
@click.option(
    "--rate-burst",
    default=4000.0,
    show_default=True,
    type=click.FloatRange(min=1),
    help="Datagrams one source may send at once before --rate-limit applies.",
)
@click.option(
    "--max-datagram",
    default=1400,
    show_default=True,
    type=click.IntRange(64, 65507),
    help="Largest datagram sent; publishes packed for one subscriber up to this size, "
    "longer publish lines dropped and counted.",
)
@click.option(
    "--cookie-period",
    default=60.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds a subscriber's cookie stays valid (between one and two periods).",
)
@events_option(
    help="Append one JSON line per server event (subscriptions added, expired, evicted; "
    "counters every --stats-interval) to this file.",
)
@click.option(
    "--server-id", default=None, help="Name of this server in the events (default: hostname:port)."
)
@click.option(
    "--stats-interval",
    default=60.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds between topics_counters events (every drop and malformed line counted).",
)
@metrics_option()
@log_options(
    default_level="info",
    level_help="Least important log lines shown (info shows every subscription added or lapsed).",
)
def server_main(
    address: str,
    port: int,
    lifetime: float,
    table_size: int,
    work_difficulty: int,
    rate_limit: float,
    rate_burst: float,
    max_datagram: int,
    cookie_period: float,
    events_path: str | None,
    server_id: str | None,
    stats_interval: float,
    metrics: tuple[str, int] | None,
    log_format: str,
    log_level: str,
) -> None:
    """Run a topics server: soft-state publish/subscribe on one UDP port."""
    from echo.log import configure_logging

    configure_logging(log_format, log_level)  # type: ignore[arg-type]
    config = ServerConfig(
        lifetime=lifetime,
        table_size=table_size,
        work_difficulty=work_difficulty,
        rate_limit=rate_limit,
        rate_burst=rate_burst,
        max_datagram=max_datagram,
        cookie_period=cookie_period,
    )
    log = structlog.get_logger("echo.topics")
    try:
        events = TopicEvents(events_path, server_id=server_id or f"{socket.gethostname()}:{port}")
    except OSError as error:
        fail("echo-topics", f"cannot open --events {events_path}: {one_line(error)}")
    server = TopicServer(
        config, address=address, port=port, events=events, stats_interval=stats_interval
    )
    ops = open_ops(metrics, "echo-topics")
    if ops is not None:
        ops.register(TopicsCollector(server))
    try:
        trio.run(_serve, server, log, ops)
    except BaseException as error:
        found = sole_error(error, OSError)
        if found is None:
            raise
        why = one_line(found)
        log.error("server_failed", error=why)
        fail("echo-topics", f"cannot listen on {address}:{port}: {why}")
    finally:
        events.close()


async def _serve(server: TopicServer, log: Any, ops: Ops | None = None) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            if ops is not None:
                await ops.start(nursery)
            host, port = await nursery.start(server.run)
            nursery.start_soon(trim_heap)  # freed pages back to the kernel, as echo-server
            probe = probe_from_environment(os.environ)  # ECHO_MEMDEBUG, as on echo-server
            if probe is not None:
                await nursery.start(serve_probe, probe, log)
            if ops is not None:
                ops.health.ready()
            config = server.core.config
            log.info(
                "listening",
                address=host,
                port=port,
                lifetime=config.lifetime,
                table_size=config.table_size,
                work_difficulty=config.work_difficulty,
                pid=os.getpid(),
            )
            async for signum in signals:
                log.info("shutting_down", signal=signal.Signals(signum).name)
                if ops is not None:
                    ops.health.draining()
                nursery.cancel_scope.cancel()
                break


# --------------------------------------------------------------------------------------------
# echo-topic

CLIENT_EPILOG = """\b
Servers: --servers host:port,host:port or --servers-file FILE (one host:port a line, # comments).
Each topic goes to the K servers next to it on a consistent-hash ring of the list; clients with
somewhat different lists still meet on the servers they share.
"""


def _server_options(function: Any) -> Any:
    options = [
        click.option(
            "--servers",
            default=None,
            help=f"Comma-separated host:port list of topic servers "
            f"[default: 127.0.0.1:{DEFAULT_PORT} unless --servers-file].",
        ),
        click.option(
            "--servers-file",
            type=click.Path(dir_okay=False),
            default=None,
            help="File with one host:port a line (instead of --servers).",
        ),
        count_option(
            "--k",
            "k",
            default=3,
            minimum=1,
            help="K: servers per topic, by consistent hashing (fewer if the list is shorter).",
        ),
        log_options(default_level="warning"),
    ]
    for option in reversed(options):
        function = option(function)
    return function


def _servers(servers: str | None, servers_file: str | None) -> list[str]:
    if servers is not None and servers_file is not None:
        raise click.UsageError("give --servers or --servers-file, not both")
    try:
        if servers_file is not None:
            listed = read_servers_file(servers_file)
        else:
            listed = parse_servers(servers or f"127.0.0.1:{DEFAULT_PORT}")
    except OSError as error:
        raise click.BadParameter(one_line(error), param_hint="--servers-file") from None
    except ValueError as error:
        hint = "--servers-file" if servers_file is not None else "--servers"
        raise click.BadParameter(str(error), param_hint=hint) from None
    if not listed:
        raise click.BadParameter("no servers listed", param_hint="--servers-file")
    hint = "--servers-file" if servers_file is not None else "--servers"
    for server in listed:
        check_resolvable(*split_server(server), hint)
    return listed


def _check_topic(topic: str) -> None:
    encoded = encode(topic.encode())
    if not encoded or len(encoded) > MAX_FIELD:
        raise click.BadParameter(
            f"{topic!r}: a topic is 1 to {MAX_FIELD} bytes once %-encoded", param_hint="TOPIC"
        )


@click.group(epilog=CLIENT_EPILOG)
def client_main() -> None:
    """Subscribe to topics or publish on one, through topics servers (echo-topics)."""


SUBSCRIBE_EPILOG = """\b
Output: each message once (copies from several servers and resends are deduplicated), as
"TOPIC MESSAGE" lines, or with --json one object a line:
{"topic": ..., "message": ..., "id": ..., "server": ...}.
\b
Exit status: 0 --count messages received, or stopped by SIGINT/SIGTERM; 1 no server confirmed
the subscription within --confirm-timeout (all down?), or a socket error; 2 a bad command line
(including a server name that does not resolve); 3 --timeout passed before --count messages.
"""


@client_main.command(epilog=SUBSCRIBE_EPILOG)
@_server_options
@click.option(
    "--k-prime",
    default=None,
    type=click.IntRange(min=1),
    help="RCH: subscribe at a random K' of the K servers only (publishers must then publish "
    "to all K). Fewer refreshes; each message arrives K' times at most.",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per message.")
@count_option(
    "--count", default=0, help="Exit 0 after this many messages (0: run until interrupted)."
)
@click.option(
    "--timeout",
    default=0.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Exit 3 if --count messages have not arrived within this many seconds (0: wait).",
)
@click.option(
    "--confirm-timeout",
    default=5.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Exit 1 if no server has confirmed the subscription within this many seconds.",
)
@click.option(
    "--refresh-factor",
    "-M",
    default=3.0,
    show_default=True,
    type=click.FloatRange(min=1),
    help="M: refresh every N/M seconds, N being the lifetime each server confirms.",
)
@click.argument("topics", nargs=-1, required=True)
def subscribe(
    servers: str | None,
    servers_file: str | None,
    k: int,
    log_format: str,
    log_level: str,
    k_prime: int | None,
    as_json: bool,
    count: int,
    timeout: float,
    confirm_timeout: float,
    refresh_factor: float,
    topics: Sequence[str],
) -> None:
    """Print the messages published on TOPIC... (each once)."""
    from echo.log import configure_logging

    configure_logging(log_format, log_level)  # type: ignore[arg-type]
    listed = _servers(servers, servers_file)
    for topic in topics:
        _check_topic(topic)
    if k_prime is not None and k_prime > k:
        raise click.BadParameter(f"--k-prime {k_prime} is more than --k {k}")
    config = ClientConfig(k=k, subscribe_k_prime=k_prime, refresh_factor=refresh_factor)
    code = _run_client(_subscribe, listed, config, topics, as_json, count, timeout, confirm_timeout)
    sys.exit(code)


def _print_message(message: Message, as_json: bool) -> None:
    topic = message.topic.decode("utf-8", "backslashreplace")
    text = message.data.decode("utf-8", "backslashreplace")
    if as_json:
        record = {
            "topic": topic,
            "message": text,
            "id": message.message_id.decode() if message.message_id else None,
            "server": message.server,
        }
        print(json.dumps(record), flush=True)
    else:
        print(f"{topic} {text}", flush=True)


async def _subscribe(
    listed: list[str],
    config: ClientConfig,
    topics: Sequence[str],
    as_json: bool,
    count: int,
    timeout: float,
    confirm_timeout: float,
) -> int:
    async with open_topic_client(listed, config) as client:
        client.subscribe(*topics)
        with trio.move_on_after(confirm_timeout):
            await client.wait_subscribed(*topics, servers=1)
        # The first confirmation is enough to start; the others get a moment to arrive so
        # that the report below names only servers that really did not answer.
        with trio.move_on_after(min(confirm_timeout, 0.5)):
            await client.wait_subscribed(*topics)
        for topic in topics:
            confirmed = client.core.confirmed_servers(topic.encode())
            chosen = client.core.subscriptions[encode(topic.encode())]
            missing = [name for name in chosen if name not in confirmed]
            if not confirmed:
                click.echo(
                    f"echo-topic: no server confirmed {topic!r} within {confirm_timeout:g} s "
                    f"(tried {', '.join(chosen)})",
                    err=True,
                )
                return EXIT_FAILURE
            if missing:
                click.echo(
                    f"echo-topic: {topic!r}: no answer yet from {', '.join(missing)}; "
                    f"subscribed at {', '.join(confirmed)}",
                    err=True,
                )
        click.echo(f"echo-topic: subscribed to {', '.join(topics)}", err=True)
        received = 0
        with trio.move_on_after(timeout or math.inf):
            async for message in client.messages():
                _print_message(message, as_json)
                received += 1
                if count and received >= count:
                    return 0
        if count:
            click.echo(f"echo-topic: {received} of {count} messages within {timeout:g} s", err=True)
            return 3
        return 0


PUBLISH_EPILOG = """\b
UDP gives no receipt: the message is sent to the topic's servers (K, or K' with --k-prime),
--copies times each, and delivered to whoever is subscribed there at that moment.
\b
Exit status: 0 sent; 1 a socket error; 2 a bad command line (including a server name that does
not resolve and a message too long for one --max-datagram datagram).
"""


@client_main.command(epilog=PUBLISH_EPILOG)
@_server_options
@click.option(
    "--k-prime",
    default=None,
    type=click.IntRange(min=1),
    help="RCH: publish to a random K' of the K servers only (subscribers must then subscribe "
    "at all K). Less sending per message; each subscriber renews K subscriptions.",
)
@click.option("--json", "as_json", is_flag=True, help="Print what was sent as one JSON object.")
@click.option(
    "--copies",
    default=2,
    show_default=True,
    type=click.IntRange(1, 100),
    help="Send each message this many times to each server (subscribers deduplicate).",
)
@click.option(
    "--resend-interval",
    default=0.05,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds between the copies.",
)
@click.option(
    "--max-datagram",
    default=1400,
    show_default=True,
    type=click.IntRange(64, 65507),
    help="Largest datagram to send (servers drop longer publish lines).",
)
@click.argument("topic")
@click.argument("message")
def publish(
    servers: str | None,
    servers_file: str | None,
    k: int,
    log_format: str,
    log_level: str,
    k_prime: int | None,
    as_json: bool,
    copies: int,
    resend_interval: float,
    max_datagram: int,
    topic: str,
    message: str,
) -> None:
    """Publish MESSAGE on TOPIC ("-" reads the message from standard input)."""
    from echo.log import configure_logging

    configure_logging(log_format, log_level)  # type: ignore[arg-type]
    listed = _servers(servers, servers_file)
    _check_topic(topic)
    if k_prime is not None and k_prime > k:
        raise click.BadParameter(f"--k-prime {k_prime} is more than --k {k}")
    data = sys.stdin.buffer.read() if message == "-" else message.encode()
    length = len(format_publish(topic.encode(), data, new_message_id()))
    if length > max_datagram:
        raise click.BadParameter(
            f"a publish line of {length} bytes does not fit one {max_datagram}-byte datagram "
            "(--max-datagram); shorten the message",
            param_hint="MESSAGE",
        )
    config = ClientConfig(
        k=k,
        publish_k_prime=k_prime,
        copies=copies,
        resend_interval=resend_interval,
        max_datagram=max_datagram,
    )
    sys.exit(_run_client(_publish, listed, config, topic, data, as_json))


async def _publish(
    listed: list[str], config: ClientConfig, topic: str, data: bytes, as_json: bool
) -> int:
    async with open_topic_client(listed, config) as client:
        try:
            message_id = client.publish(topic, data)
        except CodecError as error:
            click.echo(f"echo-topic: {error}", err=True)
            return 2
        await client.wait_sent()
        sent_to = client.core.servers_for(encode(topic.encode()))
        if as_json:
            print(json.dumps({"topic": topic, "id": message_id.decode(), "k": len(sent_to)}))
        else:
            click.echo(
                f"echo-topic: published {message_id.decode()} on {topic!r} "
                f"({config.copies} copies to each of {config.publish_k_prime or len(sent_to)} "
                "servers)",
                err=True,
            )
        return 0


def _run_client(function: Any, *args: Any) -> int:
    async def main() -> int:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            result = 0
            async with trio.open_nursery() as nursery:

                async def work() -> None:
                    nonlocal result
                    result = await function(*args)
                    nursery.cancel_scope.cancel()

                async def stop() -> None:
                    async for _ in signals:
                        nursery.cancel_scope.cancel()
                        return

                nursery.start_soon(work)
                nursery.start_soon(stop)
            return result

    try:
        return trio.run(main)
    except BaseException as error:
        found = sole_error(error, OSError)
        if found is None:
            raise
        click.echo(f"echo-topic: {one_line(found)}", err=True)
        return 1


if __name__ == "__main__":  # pragma: no cover
    client_main()
