"""Prometheus metrics of echo's servers, read at scrape time from the counts they keep.

The transport, the session server, the lobby and the topics server already count what they
do in plain ints (`echo.transport.core.counters`, `SessionServer.admissions`,
`LobbyRegistry.counters`, `echo.topics.server.Counters`): bumping an int is the cheapest
thing a hot path can do. The collectors here turn those into metric families only when
Prometheus scrapes, so serving a datagram costs nothing more with `--metrics` than without.
Each server has its own `CollectorRegistry`, so several servers (or tests) in one process
never share a count.

Naming follows Prometheus's practice: `echo_<layer>_<what>_<unit>`, base units (seconds,
bytes), `_total` on counters, and labels only over small fixed sets (a reason, a result, a
state): never a player, an address or a lobby.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from echo.ops.http import Health

if TYPE_CHECKING:
    from echo.lobby.server import LobbyServer
    from echo.session.server import SessionServer
    from echo.topics.driver import TopicServer
    from echo.transport.core.counters import Counters

__all__ = [
    "HealthCollector",
    "LobbyCollector",
    "SessionServerCollector",
    "TicketCollector",
    "TopicsCollector",
    "TransportCollector",
    "new_registry",
    "session_collectors",
]


def new_registry(health: Health, *collectors: Collector) -> CollectorRegistry:
    """A registry of its own for one server: the process's CPU, memory and fds (the client
    library's process collector), its readiness, and `collectors`."""
    from prometheus_client import ProcessCollector

    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    registry.register(HealthCollector(health))
    for collector in collectors:
        registry.register(collector)
    return registry


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def _labelled_counter(
    name: str, doc: str, label: str, values: Mapping[str, float], known: Iterable[str] = ()
) -> CounterMetricFamily:
    """One counter family by `label`; the `known` values are always there (0 until counted),
    so a rate() over them works from the first scrape."""
    family = CounterMetricFamily(name, doc, labels=[label])
    for key in sorted(set(known) | set(values)):
        family.add_metric([key], values.get(key, 0))
    return family


def _labelled_gauge(
    name: str, doc: str, label: str, values: Mapping[str, float], known: Iterable[str] = ()
) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=[label])
    for key in sorted(set(known) | set(values)):
        family.add_metric([key], values.get(key, 0))
    return family


def _snake(text: str) -> str:
    return text.strip().lower().replace(" ", "_").replace("-", "_")


class HealthCollector(Collector):
    def __init__(self, health: Health) -> None:
        self.health = health

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "echo_ready",
            "1 while the server admits (what /readyz says), 0 while it starts or drains",
            value=1 if self.health.is_ready else 0,
        )


# ------------------------------------------------------------------------------ transport

#: Transport counters exported one to one, as echo_transport_<field>_total (the drops and the
#: invalid frames are exported by reason instead, below).
TRANSPORT_COUNTERS: dict[str, str] = {
    "datagrams_received": "UDP datagrams received, on every socket of the server",
    "datagrams_sent": "UDP datagrams sent (one per destination)",
    "bytes_received": "Bytes of the datagrams received",
    "bytes_sent": "Bytes of the datagrams sent",
    "data_frames_sent": "Datagrams of new data sent",
    "heartbeats_sent": "Heartbeats (empty data frames) sent",
    "heartbeats_received": "Heartbeats received",
    "setups_sent": "SETUP frames sent",
    "setups_received": "SETUP frames received",
    "status_messages_sent": "Status messages (flow-control acknowledgements) sent",
    "status_messages_received": "Status messages received",
    "setup_elicitations_received": "Setup-eliciting status messages received (registrations)",
    "naks_sent": "NAKs sent: gaps this server asked its peers to send again",
    "naks_received": "NAKs received: gaps peers asked this server to send again",
    "retransmits_sent": "Retransmissions sent in answer to NAKs",
    "retransmitted_bytes": "Bytes retransmitted",
    "duplicate_data": "Data frames received that were already received",
    "images_created": "Images (incoming streams) created",
    "images_closed": "Images closed",
    "images_revoked": "Images ended because their publisher revoked the stream",
    "destinations_added": "MDC destinations added (clients on an all-clients channel)",
    "destinations_removed": "MDC destinations removed",
    "send_errors": "Sends the socket refused",
    "receive_errors": "Receives the socket reported an error for",
    "send_would_block": "Sends that found the socket buffer full",
    "cookie_challenges_sent": "Address-validation cookies sent",
    "cookies_received": "Address-validation cookies answered",
}

#: Datagrams or frames the transport dropped, by reason: reason -> the counter.
TRANSPORT_DROPS: dict[str, str] = {
    "invalid_frame": "invalid_frames",
    "unknown_session": "unknown_session_drops",
    "session_filter": "session_filter_drops",
    "unvalidated": "unvalidated_drops",
    "rate_limited": "rate_limited",
    "amplification_limited": "amplification_limited",
    "flow_control_overrun": "flow_control_overruns",
    "destination_refused": "destinations_refused",
}


class TransportCollector(Collector):
    """The counters of one transport (`counters()` gives them, or None before it opens)."""

    def __init__(self, counters: Callable[[], Counters | None]) -> None:
        self.counters = counters

    def collect(self) -> Iterator[Metric]:
        counters = self.counters()
        values: dict[str, int] = {}
        invalid: Mapping[str, int] = {}
        if counters is not None:
            values = {name: getattr(counters, name) for name in _TRANSPORT_FIELDS}
            invalid = dict(counters.invalid_by_reason)
        for field, doc in TRANSPORT_COUNTERS.items():
            yield _counter(f"echo_transport_{field}", doc, values.get(field, 0))
        yield _labelled_counter(
            "echo_transport_drops",
            "Datagrams or frames the transport dropped, by reason",
            "reason",
            {reason: values.get(field, 0) for reason, field in TRANSPORT_DROPS.items()},
        )
        yield _labelled_counter(
            "echo_transport_invalid_frames",
            "Frames dropped as invalid, by what was wrong",
            "reason",
            invalid,
        )


_TRANSPORT_FIELDS = (*TRANSPORT_COUNTERS, *TRANSPORT_DROPS.values())


# ------------------------------------------------------------------------------ sessions


class SessionServerCollector(Collector):
    """Admission and sessions of a `SessionServer` (echo-server's, echo-lobby's)."""

    def __init__(self, server: SessionServer) -> None:
        self.server = server

    def collect(self) -> Iterator[Metric]:
        from echo.session.server import ADMISSION_RESULTS, CLOSE_REASONS

        server = self.server
        duologues = server.duologues.values()
        joined = sum(1 for d in duologues if d.session is not None and not d.session.is_closed)
        yield GaugeMetricFamily(
            "echo_session_sessions_open",
            "Sessions open: duologues whose client joined and that are not closed",
            value=joined,
        )
        yield GaugeMetricFamily(
            "echo_session_duologues_open",
            "Duologues allocated (ports and a session id held), joined or still waiting",
            value=len(server.duologues),
        )
        yield GaugeMetricFamily(
            "echo_session_max_sessions",
            "The most duologues the server holds at once (--max-clients)",
            value=server.config.max_clients,
        )
        yield _counter("echo_session_hellos", "Handshakes (HELLOs) received", server.hellos)
        yield _labelled_counter(
            "echo_session_admissions",
            "HELLOs by outcome: accepted, or why refused (per_ip_limit: the per-address limit)",
            "result",
            server.admissions,
            ADMISSION_RESULTS,
        )
        yield _counter(
            "echo_session_sessions_opened", "Sessions whose client joined", server.sessions_opened
        )
        yield _labelled_counter(
            "echo_session_sessions_closed",
            "Duologues ended, by reason",
            "reason",
            {_snake(k): v for k, v in server.closes.items()},
            (_snake(reason) for reason in CLOSE_REASONS),
        )
        yield _labelled_counter(
            "echo_session_resumes",
            "RESUMEs (a session taken to a new address) by result",
            "result",
            {"accepted": server.resumes, "refused": server.resumes_refused},
        )
        yield _counter(
            "echo_session_application_errors",
            "Sessions whose application raised",
            server.application_errors,
        )


def session_collectors(server: SessionServer) -> tuple[Collector, Collector]:
    """The collectors of a session server and of the transport it opens when it runs."""

    def counters() -> Counters | None:
        return None if server.transport is None else server.transport.counters

    return SessionServerCollector(server), TransportCollector(counters)


class TicketCollector(Collector):
    """echo-server --ticket-key: game tickets shown in HELLOs, by verdict."""

    def __init__(self, outcomes: Counter[str]) -> None:
        self.outcomes = outcomes

    def collect(self) -> Iterator[Metric]:
        from echo.tickets import TicketReason

        known = ["admitted", "missing", *(reason.name.lower() for reason in TicketReason)]
        yield _labelled_counter(
            "echo_server_tickets",
            "Game tickets checked at admission: admitted, or why refused",
            "result",
            self.outcomes,
            known,
        )


# ------------------------------------------------------------------------------ lobby

#: LobbyRegistry and LobbyServer counters exported one to one, as echo_lobby_<name>_total.
LOBBY_COUNTERS: dict[str, str] = {
    "lobbies_created": "Lobbies created",
    "lobbies_deleted": "Lobbies deleted (empty)",
    "lobbies_recreated": "Lobbies re-created here from a member's copy",
    "joins": "Members who joined a lobby (by id or code)",
    "quick_joins": "Members placed by quick-join",
    "leaves": "Members who left a lobby",
    "kicks": "Members kicked",
    "bans": "Members banned",
    "searches": "Searches",
    "chat_lines": "Chat lines accepted",
    "chat_deliveries": "Chat lines delivered (one per member it went to)",
    "chat_held": "Chat lines kept for a member away from its seat, for its return",
    "chat_held_dropped": "Chat lines kept for an away member and dropped again: its held "
    "chat was full",
    "games_started": "Games started",
    "tickets_issued": "Game tickets issued (one per connected member of a started game)",
    "tickets_reissued": "Fresh tickets for a running game (a player who crashed came back)",
    "games_ended": "Games ended (a result, a timeout, or a game server the players reported)",
    "games_timed_out": "Games ended by the lobby for lack of a result within the game's life",
    "game_results_ended": "Signed game results that ended a running game",
    "game_results_not_running": "Signed game results for no running game (repeats, late)",
    "game_results_held": "Signed game results for a lobby not here (yet), held for its "
    "re-creation here",
    "game_results_applied_late": "Held game results that ended a lobby's game once its "
    "members re-created it here",
    "games_recreated": "Running games re-created here with their lobby, from members' copies",
    "game_copies_refused": "Members' copies of a running game not believed (a ticket not "
    "signed by our ticket keys, or not the member's)",
    "game_copies_stale": "Members' copies of a game that ended, or older than another copy",
    "game_server_reports": "Players' reports of a game server refusing their tickets",
    "game_servers_benched": "Game servers taken out of rotation after the players' reports",
    "members_dropped": "Members whose session dropped (seat kept for the grace period)",
    "members_reconnected": "Members who came back within the grace period",
    "members_expired": "Members whose grace period ran out",
    "owner_migrations": "Times a lobby's ownership moved to another member",
}
#: LobbyServer (driver) counters, as echo_lobby_<name>_total.
LOBBY_SERVER_COUNTERS: dict[str, str] = {
    "hellos_refused": "Member sessions refused at the hello (bad id, id in use, seat needed, "
    "identity token refused)",
    "hellos_timed_out": "Member sessions closed for sending no hello",
    "seats_reclaimed": "Seats taken back by a returning member",
    "sessions_replaced": "Member sessions replaced by a newer one of the same member",
    "seats_resumed": "Seats taken back by a new process of the member with a resume token",
    "resumes_refused": "Resume tokens refused (forged, expired, replayed, seat gone)",
    "chat_dropped": "Chat lines dropped for a member whose chat backlog was full",
    "game_results_refused": "Game results ignored: not signed by a ticket key of this server",
    "members_too_slow": "Member sessions closed for falling behind on updates",
    # the WebSocket door (echo-lobby --ws-port): bad input, each kind counted
    "ws_connections": "WebSocket connections accepted",
    "ws_connections_refused": "WebSocket connections closed at once: the door held "
    "--ws-max-connections (1013)",
    "ws_bad_messages": "WebSocket messages that were not a JSON request (refused bad_request)",
    "ws_binary_frames": "WebSocket connections closed for a binary frame (1003)",
    "ws_too_big": "WebSocket connections closed for a message over the size limit (1009)",
    "ws_rate_limited": "WebSocket messages refused over the connection's message rate",
    "ws_rate_closed": "WebSocket connections closed for staying over the message rate (1008)",
    "ws_chat_queue_full": "WebSocket chat lines refused: too many waiting for the chat rate",
    "ws_ping_timeouts": "WebSocket members dropped for not answering a ping",
    # the lobby page on the door's port (echo-lobby --web, echo.lobby.webpage)
    "web_page_served": "Lobby page files served (`--web`)",
    "web_page_not_found": "Requests on the door's port for no file of the lobby page (404/405)",
    "web_page_bad_requests": "Connections on the door's port that sent no valid HTTP request",
    "web_page_timeouts": "Connections on the door's port that sent no request head in time",
}


class LobbyCollector(Collector):
    """A `LobbyServer`: its lobbies and members now, what it did, how fast it answered."""

    def __init__(self, server: LobbyServer) -> None:
        self.server = server

    def collect(self) -> Iterator[Metric]:
        from echo.lobby.protocol import ErrorCode, Presence

        server = self.server
        registry = server.registry
        lobbies, members = registry.census()
        yield _labelled_gauge(
            "echo_lobby_lobbies",
            "Lobbies homed here, by state (listed: public and open; locked: a game started "
            "or closed by its owner)",
            "state",
            lobbies,
            ("listed", "private", "locked"),
        )
        yield _labelled_gauge(
            "echo_lobby_members",
            "Seats taken in the lobbies here, by presence (reconnecting: session dropped, "
            "seat kept for the grace period)",
            "presence",
            {p.name.lower(): n for p, n in members.items()},
            (p.name.lower() for p in Presence),
        )
        yield GaugeMetricFamily(
            "echo_lobby_member_sessions",
            "Members connected to this server (in a lobby or not)",
            value=len(server.conns),
        )
        counts: Counter[str] = Counter(registry.counters)
        for name, doc in LOBBY_COUNTERS.items():
            yield _counter(f"echo_lobby_{name}", doc, counts[name])
        for name, doc in LOBBY_SERVER_COUNTERS.items():
            yield _counter(f"echo_lobby_{name}", doc, server.counters[name])
        refusals: dict[str, int] = {code.name.lower(): n for code, n in registry.refusals.items()}
        for undecodable in ("bad_messages", "wrong_channel"):
            refusals["bad_request"] = refusals.get("bad_request", 0) + server.counters[undecodable]
        yield _labelled_counter(
            "echo_lobby_refusals",
            "Requests refused, by error code",
            "code",
            refusals,
            (code.name.lower() for code in ErrorCode),
        )
        from echo.ops.queue_metrics import queue_metrics

        yield from queue_metrics(server.queues)  # the matchmaker's
        from echo.lobby.identity import REASONS

        yield _labelled_counter(
            "echo_lobby_auth_refusals",
            "Member sessions refused for their identity token (--auth-key), by reason",
            "reason",
            server.auth_refusals,
            REASONS,
        )
        seen: set[int] = set()
        for histogram in server.latency.values():
            if id(histogram) not in seen:
                seen.add(id(histogram))
                for family in histogram.collect():
                    # (Without the client library's `_created` series: a start time per
                    # histogram says nothing process_start_time_seconds does not.)
                    family.samples = [
                        s for s in family.samples if s.name != family.name + "_created"
                    ]
                    yield family


# ------------------------------------------------------------------------------ topics

#: Topics-server counters exported one to one, as echo_topics_<name>_total.
TOPICS_COUNTERS: dict[str, str] = {
    "datagrams_received": "UDP datagrams received",
    "bytes_received": "Bytes received",
    "lines_received": "Protocol lines received",
    "datagrams_sent": "UDP datagrams sent",
    "bytes_sent": "Bytes sent",
    "subscribes": "Subscribe lines received (new or refresh)",
    "subscriptions_added": "Subscriptions added",
    "subscriptions_refreshed": "Subscriptions refreshed before they lapsed",
    "subscriptions_expired": "Subscriptions that lapsed (not refreshed in time)",
    "subscriptions_evicted": "Subscriptions evicted from a full table",
    "cookies_sent": "Cookies sent to unconfirmed sources",
    "publishes": "Messages published",
    "deliveries": "Messages forwarded to subscribers (the fan-out)",
}
#: Topics-server counts of what was dropped or refused, by reason.
TOPICS_DROPS: dict[str, str] = {
    "rate_limited": "rate_limited",
    "subscription_refused": "subscriptions_refused",
    "unconfirmed_subscribe": "unconfirmed_subscribes",
    "cookie_withheld": "cookies_withheld",
    "bad_cookie": "bad_cookies",
    "insufficient_work": "insufficient_work",
    "confirm_without_subscribe": "confirms_without_subscribe",
    "publish_too_large": "publishes_too_large",
    "malformed_line": "malformed_lines",
    "send_error": "send_errors",
    "receive_error": "receive_errors",
}


class TopicsCollector(Collector):
    """A `TopicServer`: its subscriptions and what it forwarded and dropped."""

    def __init__(self, server: TopicServer) -> None:
        self.server = server

    def collect(self) -> Iterator[Metric]:
        values: dict[str, Any] = self.server.counters
        yield GaugeMetricFamily(
            "echo_topics_subscriptions",
            "Subscriptions live now (topic and subscriber pairs)",
            value=values["subscriptions"],
        )
        yield GaugeMetricFamily(
            "echo_topics_topics",
            "Topics with at least one subscriber",
            value=len(self.server.core.topics),
        )
        for name, doc in TOPICS_COUNTERS.items():
            yield _counter(f"echo_topics_{name}", doc, values[name])
        yield _labelled_counter(
            "echo_topics_drops",
            "Datagrams, lines or requests dropped or refused, by reason "
            "(rate_limited: a source over its per-address rate)",
            "reason",
            {reason: values[field] for reason, field in TOPICS_DROPS.items()},
        )
        yield _labelled_counter(
            "echo_topics_malformed_lines",
            "Malformed lines, by what was wrong",
            "reason",
            values["malformed"],
        )
