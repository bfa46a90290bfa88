"""The matchmaker's desk on one lobby server: queue requests in, matched lobbies out.

`QueueDesk` checks and answers `EnqueueMatch` and `CancelMatch` (rate-limited per member:
a flood is refused RATE_LIMITED with its retry time, as the registry's requests are), keeps
the `Matchmaker` core's queues, and on each `tick` seats every match it formed in a new lobby
of the `LobbyRegistry` (`seat_match`): each member gets `Matched`, then its `LobbyJoined`
(request id 0, with its seat) and the lobby's snapshot, as after a join; a match whose
tickets all asked for it is started at once through the registry's own start (`StartGame`
from the owner: the same game-server pick, tickets and `GameStarting`).

A queue lives on the server its (mode, region) hashes to on the lobby servers' ring
(`echo.lobby.matchmaker.queue_home`); that choice is the client's, as for a lobby's home.
Only members whose session is open here are queued (the server calls `withdraw` when one
ends); a client sends its entry again after it reconnects, here or, if this server died, on
the queue's next home, with the time it already waited.

Pure module: no trio, no clock (`now` is passed in).
"""

from __future__ import annotations

from collections import Counter

import attrs
import structlog

from echo.lobby.limits import RateLimit, TokenBucket
from echo.lobby.matchmaker import Entry, Match, Matchmaker, MatchRules, QueueError
from echo.lobby.protocol import Done, ErrorCode, GameStarting, LobbyJoined, Refusal, StartGame
from echo.lobby.queue_stats import WaitHistogram
from echo.lobby.queue_wire import CancelMatch, EnqueueMatch, Matched, Queued, QueueLeft
from echo.lobby.state import Handled, LobbyRegistry, Seats, Send

log = structlog.get_logger("echo.lobby.queues")

#: A member's queue requests: a few at once, then one a second (a client sends its entry
#: again after each reconnection; a flood is refused with the wait).
QUEUE_LIMIT = RateLimit(rate=1.0, burst=5)

_REASON_CODES = {"full": ErrorCode.SERVER_FULL, "party": ErrorCode.PARTY_INVALID}


@attrs.frozen
class Seated:
    """One match seated in a lobby of this server."""

    lobby_id: int
    match: Match
    started: bool
    game_server: str = ""  # the game server it was started on (started only)


class QueueDesk:
    def __init__(
        self,
        registry: LobbyRegistry,
        *,
        rules: MatchRules | None = None,
        seats: Seats | None = None,
        limit: RateLimit = QUEUE_LIMIT,
    ) -> None:
        self.registry = registry
        self.matchmaker = Matchmaker(rules)
        self._seats = seats
        self._limit = limit
        self._buckets: dict[str, TokenBucket] = {}
        self._secrets: dict[str, bytes] = {}  # queued member -> its session's hello secret
        self.counters: Counter[str] = Counter()
        self.refusals: Counter[ErrorCode] = Counter()  # queue requests refused, by code
        self.waits = WaitHistogram()  # how long each matched player waited (echo.ops metrics)

    def __len__(self) -> int:
        return len(self.matchmaker)

    # --- requests -----------------------------------------------------------------------------

    def handle(
        self, member_id: str, request: EnqueueMatch | CancelMatch, now: float, *, secret: bytes
    ) -> Handled:
        """Answer one queue request; never raises for a bad one."""
        bucket = self._buckets.get(member_id)
        if bucket is None:
            bucket = self._buckets[member_id] = TokenBucket(self._limit, now)
        if not bucket.take(now):
            self.counters["queue_rate_limited"] += 1
            wait = bucket.wait(now)
            return self._refuse(
                request,
                ErrorCode.RATE_LIMITED,
                f"too many queue requests; slow down (retry in {wait:.3f} s)",
            )
        if isinstance(request, CancelMatch):
            dropped = self.matchmaker.cancel(member_id)
            if dropped is None:
                return self._refuse(request, ErrorCode.NOT_QUEUED, "not in a queue")
            self.counters["queue_cancelled"] += 1
            others = tuple(m for m in dropped.members if m != member_id)
            for m in dropped.members:
                self._secrets.pop(m, None)
            left = QueueLeft(dropped.ticket_id, dropped.reason)
            return Handled(Done(request.request_id), (Send(others, left),) if others else ())
        return self._enqueue(member_id, request, now, secret)

    def _enqueue(self, member_id: str, req: EnqueueMatch, now: float, secret: bytes) -> Handled:
        seated = self.registry.lobby_of(member_id)
        if req.party == 0 and seated is not None:
            return self._refuse(
                req, ErrorCode.ALREADY_IN_LOBBY, "in a lobby here: leave it, or queue it as a party"
            )
        if req.party != 0:
            if seated == req.party:
                if self.registry.member_count(req.party) != req.party_size:
                    return self._refuse(
                        req, ErrorCode.PARTY_INVALID, "the party's size is not its lobby's"
                    )
            elif self._seats is None or not self._seats.check(req.party_seat, req.party, member_id):
                return self._refuse(
                    req, ErrorCode.PARTY_INVALID, "not a member of that party: its seat is needed"
                )
        entry = Entry(
            member_id,
            req.mode,
            req.region,
            req.skill,
            req.size,
            req.party,
            req.party_size,
            req.strict_region,
            req.start,
            req.waited_ms / 1000,
        )
        try:
            ticket = self.matchmaker.enqueue(entry, now)
        except QueueError as error:
            return self._refuse(
                req, _REASON_CODES.get(error.reason, ErrorCode.BAD_REQUEST), str(error)
            )
        self._secrets[member_id] = secret
        self.counters["queue_entries"] += 1
        return Handled(Queued(req.request_id, ticket), ())

    def _refuse(
        self, request: EnqueueMatch | CancelMatch, code: ErrorCode, message: str
    ) -> Handled:
        self.counters["queue_refusals"] += 1
        self.refusals[code] += 1
        return Handled(Refusal(request.request_id, code, message), ())

    # --- sessions and time --------------------------------------------------------------------

    def withdraw(self, member_id: str, now: float) -> None:
        """The member's session here ended: out of the queue until its client sends its
        entry again."""
        self.matchmaker.withdraw(member_id, now)
        if self.matchmaker.ticket_of(member_id) is None:
            self._secrets.pop(member_id, None)

    def tick(self, now: float) -> tuple[list[Seated], tuple[Send, ...]]:
        """Drop parties that did not gather, form the matches, seat each in a new lobby."""
        sends: list[Send] = []
        for dropped in self.matchmaker.expire(now):
            self.counters["parties_dropped"] += 1
            self.counters["queue_expired"] += len(dropped.members)
            for m in dropped.members:
                self._secrets.pop(m, None)
            sends.append(Send(dropped.members, QueueLeft(dropped.ticket_id, dropped.reason)))
        seated = []
        for match in self.matchmaker.match(now):
            seated.append(self._seat(match, now, sends))
        for key, bucket in list(self._buckets.items()):
            if bucket.is_full(now):
                del self._buckets[key]
        return seated, tuple(sends)

    def _seat(self, match: Match, now: float, sends: list[Send]) -> Seated:
        members = {m: self._secrets.pop(m, b"") for m in match.members}
        first = match.tickets[0]
        regions = sorted({t.region for t in match.tickets})
        metadata = {"mode": first.mode, "region": ",".join(regions)[:128]}
        lobby_id, seated_sends = self.registry.seat_match(
            members, now, name=f"{first.mode} match"[:64], metadata=metadata, ready=match.start
        )
        for t in match.tickets:
            self.waits.observe(t.waited(now), len(t.members))
            waited_ms = min(2**32 - 1, round(t.waited(now) * 1000))
            sends.append(Send(t.members, Matched(t.ticket_id, lobby_id, waited_ms)))
        for m in members:
            seat = b"" if self._seats is None else self._seats.issue(lobby_id, m)
            sends.append(Send((m,), LobbyJoined(0, lobby_id, seat)))
        sends.extend(seated_sends)
        self.counters["matches"] += 1
        self.counters["players_matched"] += len(members)
        started = False
        game_server = ""
        if match.start:
            owner = next(iter(members))
            handled = self.registry.handle(
                owner, StartGame(0, lobby_id), now, secret=members[owner]
            )
            if isinstance(handled.reply, Refusal):
                # The lobby stays, unlocked: its members start it themselves when a game
                # server has room (the refusal is counted and logged).
                self.counters["match_start_refused"] += 1
                log.warning(
                    "lobby_match_not_started",
                    lobby_id=lobby_id,
                    code=handled.reply.code.name,
                    reason=handled.reply.message,
                )
            else:
                started = True
                sends.extend(handled.sends)
                game_server = next(
                    (
                        s.message.server_id
                        for s in handled.sends
                        if isinstance(s.message, GameStarting)
                    ),
                    "",
                )
        return Seated(lobby_id, match, started, game_server)
