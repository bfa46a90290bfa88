"""The matchmaker's pure core: queued tickets in, matches of an exact size out.

A *ticket* is one player, or a whole party (a lobby whose members queue together), waiting
for a match of `size` players in a `mode`, from a `region`, with a `skill`. `Matchmaker.match`
forms matches:

- **sizes exact**: a match holds exactly `size` players; a party is never split, so a party
  fills as many seats as it has members;
- **skill**: the spread of a match (highest minus lowest ticket skill) is within the window of
  every ticket in it; a ticket's window starts at `MatchRules.skill_window` and widens by
  `widen_per_second` of waiting, and after `open_after` seconds it is unbounded;
- **region first**: a ticket is matched in its own region only, until it has waited
  `region_wait` seconds (and is not `strict_region`): then it may join, or be joined by,
  tickets of other regions that have waited as long; same-region tickets are taken first;
- **oldest first**: the ticket that has waited longest anchors the next match (Colyseus's
  QueueRoom escalates long waiters the same way), and its seats are filled by the tickets
  closest to it in skill.

So a lone player's wait is bounded: once it has waited `open_after` (>= `region_wait`), it is
matched at the next `match` call with any players of its mode and size who have waited as
long, whatever their skill or region (strict-region tickets only within their region).

A party joins the queue member by member (`Entry.party` names its lobby, `party_size` how many
members it has): it becomes one ticket when all have arrived, and is dropped (each arrived
member told) if they have not within `party_wait`. Members come and go with their sessions,
as in Nakama's matchmaker (a ticket exists only while its player is connected): `withdraw`
takes a member out when its session ends, and its client sends its entry again, with the time
it already waited (`Entry.waited`), when it is back (on this server, or on the queue's next
home if this one died).

Pure module: no trio, no clock (`now` is passed in, in seconds).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Collection

import attrs

from echo.lobby.home import Ring

#: The largest mode or region name, in UTF-8 bytes (they travel as str8).
MAX_NAME_BYTES = 32


class QueueError(ValueError):
    """An entry the matchmaker refuses; `reason` says why (a short lowercase word)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@attrs.frozen
class MatchRules:
    """How strict a match is, and how that relaxes with waiting time."""

    skill_window: float = 100.0  # the skill spread allowed at once
    widen_per_second: float = 25.0  # and its growth per second of waiting
    region_wait: float = 10.0  # other regions accepted after this wait
    open_after: float = 30.0  # any skill (and any region) after this wait
    party_wait: float = 30.0  # a party's members all arrive within this
    max_size: int = 64  # the largest match a ticket may ask for
    max_tickets: int = 100_000  # entries held at once (tickets and arriving party members)
    scan_limit: int = 256  # candidates looked at per anchor, past the size (cost bound)

    def __attrs_post_init__(self) -> None:
        if self.skill_window < 0 or self.widen_per_second < 0:
            raise ValueError("skill windows cannot be negative")
        if not 0 <= self.region_wait <= self.open_after:
            raise ValueError("region_wait must be within 0..open_after")
        if self.party_wait <= 0 or self.max_size < 2 or self.max_tickets < 1:
            raise ValueError("party_wait > 0, max_size >= 2 and max_tickets >= 1 are needed")
        if self.scan_limit < 1:
            raise ValueError("scan_limit must be at least 1")

    def window(self, waited: float) -> float:
        """The skill spread a ticket that waited `waited` seconds accepts."""
        if waited >= self.open_after:
            return math.inf
        return self.skill_window + self.widen_per_second * max(0.0, waited)


@attrs.frozen
class Entry:
    """One member's request to be matched (a party's members each send theirs)."""

    member: str
    mode: str
    region: str
    skill: int
    size: int  # players per match
    party: int = 0  # the party's lobby id; 0 for a player queueing alone
    party_size: int = 1
    strict_region: bool = False  # never matched outside its region
    start: bool = False  # start the game at once when matched
    waited: float = 0.0  # seconds this member already waited (its entry sent again)


@attrs.frozen
class Ticket:
    ticket_id: int
    members: tuple[str, ...]  # the party's, leader (first to arrive) first
    mode: str
    region: str
    skill: float  # a party's: its members' mean
    size: int
    since: float
    party: int = 0  # the party's lobby id; 0 for a player alone
    strict_region: bool = False
    start: bool = False

    def waited(self, now: float) -> float:
        return max(0.0, now - self.since)


@attrs.frozen
class Match:
    """A match formed: its tickets, the oldest first (its first member is the lobby owner)."""

    tickets: tuple[Ticket, ...]
    formed: float

    @property
    def members(self) -> tuple[str, ...]:
        return tuple(m for t in self.tickets for m in t.members)

    @property
    def start(self) -> bool:
        """Start the game at once: every ticket asked for it."""
        return all(t.start for t in self.tickets)


@attrs.frozen
class Dropped:
    """Members taken out of the queue without a match, and why."""

    members: tuple[str, ...]
    ticket_id: int
    reason: str


@attrs.define
class _Gathering:
    """A party whose members are arriving."""

    ticket_id: int
    first: Entry
    skills: dict[str, int]
    since: float  # the earliest arrival's start of waiting
    deadline: float


def queue_key(mode: str, region: str) -> str:
    """A queue's key on the lobby servers' ring (lengths first: no two pairs share a key)."""
    return f"queue:{len(mode)}:{mode}:{region}"


def queue_home(ring: Ring, mode: str, region: str, dead: Collection[str] = ()) -> str | None:
    """The lobby server that holds the queue of (`mode`, `region`): the first server of its
    ring walk that is not in `dead`, as for a lobby (`echo.lobby.home.failover_home`)."""
    for server in ring.servers_for(queue_key(mode, region), len(dead) + 1):
        if server not in dead:
            return server
    return None


def check_entry(entry: Entry, rules: MatchRules) -> None:
    """Refuse an entry that cannot be queued (QueueError), before anything changes."""
    for name in (entry.mode, entry.region):
        size = len(name.encode())
        if not 0 < size <= MAX_NAME_BYTES or not name.isprintable():
            raise QueueError("name", f"modes and regions are 1..{MAX_NAME_BYTES} printable bytes")
    if not 2 <= entry.size <= rules.max_size:
        raise QueueError("size", f"a match holds 2..{rules.max_size} players")
    if entry.party == 0 and entry.party_size != 1:
        raise QueueError("party", "a player queueing alone is a party of 1")
    if not 1 <= entry.party_size <= entry.size:
        raise QueueError("party", "a party larger than its match cannot be seated")
    if not (math.isfinite(entry.waited) and entry.waited >= 0):
        raise QueueError("waited", "the time already waited is a finite number >= 0")


class Matchmaker:
    """Every queue of one lobby server (pools by mode and size; regions inside a pool)."""

    def __init__(self, rules: MatchRules | None = None) -> None:
        self.rules = rules or MatchRules()
        # (mode, size) -> tickets ordered by (skill, ticket id)
        self._pools: dict[tuple[str, int], list[tuple[float, int]]] = {}
        self._tickets: dict[int, Ticket] = {}
        self._gathering: dict[int, _Gathering] = {}  # party lobby id -> arriving members
        self._gathering_ids: dict[int, int] = {}  # its ticket id -> party lobby id
        self._member: dict[str, int] = {}  # member -> its ticket (or its party's gathering)
        self._party_ticket: dict[int, int] = {}  # party lobby id -> its complete ticket
        self._next_ticket = 1
        self.matches_formed = 0

    # --- queries ------------------------------------------------------------------------------

    def __len__(self) -> int:
        """Members queued (in tickets and in arriving parties)."""
        return len(self._member)

    def ticket_of(self, member: str) -> int | None:
        return self._member.get(member)

    def tickets(self) -> list[Ticket]:
        return list(self._tickets.values())

    def queued(self) -> list[tuple[str, str, int]]:
        """(mode, region, players) of every ticket and every party still gathering."""
        out = [(t.mode, t.region, len(t.members)) for t in self._tickets.values()]
        out += [(g.first.mode, g.first.region, len(g.skills)) for g in self._gathering.values()]
        return out

    # --- entries ------------------------------------------------------------------------------

    def enqueue(self, entry: Entry, now: float) -> int:
        """Queue `entry`; its ticket id. The same entry sent again (its client reconnected)
        keeps its place; a changed one replaces it. A party's members each send theirs: it is
        one ticket once all have arrived. Raises QueueError, changing nothing."""
        check_entry(entry, self.rules)
        current = self._member.get(entry.member)
        if current is None and len(self._member) >= self.rules.max_tickets:
            raise QueueError("full", "this server's queues are full")
        gathering = self._gathering.get(entry.party) if entry.party else None
        if gathering is not None and not _same_wish(gathering.first, entry):
            raise QueueError("party", "the party's members asked for different matches")
        if current is not None:
            ticket = self._tickets.get(current)
            if ticket is not None and _same_wish(_wish_of(ticket), entry):
                return current  # sent again: it keeps its place
            if gathering is not None and gathering.ticket_id == current:
                return current  # this party member arrived already
            self.withdraw(entry.member, now)
        queued = self._party_ticket.get(entry.party) if entry.party else None
        if queued is not None and entry.member not in self._tickets[queued].members:
            # Its party queued as a smaller one (a member's view of the lobby was behind):
            # waiting here would never complete it.
            size = len(self._tickets[queued].members)
            raise QueueError("party", f"the party is queued already as {size} without this member")
        since = now - min(entry.waited, self.rules.open_after)
        if entry.party == 0:
            return self._add_ticket((entry.member,), entry, float(entry.skill), since)
        gathering = self._gathering.get(entry.party)
        if gathering is None:
            ticket_id = self._fresh_id()
            gathering = _Gathering(ticket_id, entry, {}, since, now + self.rules.party_wait)
            self._gathering[entry.party] = gathering
            self._gathering_ids[ticket_id] = entry.party
        gathering.skills[entry.member] = entry.skill
        gathering.since = min(gathering.since, since)
        self._member[entry.member] = gathering.ticket_id
        if len(gathering.skills) < entry.party_size:
            return gathering.ticket_id
        self._drop_gathering(entry.party)
        members = tuple(gathering.skills)
        skill = sum(gathering.skills.values()) / len(members)
        return self._add_ticket(
            members, gathering.first, skill, gathering.since, gathering.ticket_id
        )

    def cancel(self, member: str) -> Dropped | None:
        """The member cancels: its whole ticket (its party's) leaves the queue."""
        ticket_id = self._member.get(member)
        if ticket_id is None:
            return None
        ticket = self._tickets.get(ticket_id)
        if ticket is not None:
            self._remove_ticket(ticket)
            return Dropped(ticket.members, ticket_id, f"cancelled by {member}")
        gathering = self._drop_gathering(self._gathering_ids[ticket_id])
        for m in gathering.skills:
            del self._member[m]
        return Dropped(tuple(gathering.skills), ticket_id, f"cancelled by {member}")

    def withdraw(self, member: str, now: float) -> None:
        """The member's session ended: out of the queue until its client sends its entry
        again. A party's ticket goes back to waiting for that member (for `party_wait`)."""
        ticket_id = self._member.pop(member, None)
        if ticket_id is None:
            return
        ticket = self._tickets.get(ticket_id)
        if ticket is None:
            del self._gathering[self._gathering_ids[ticket_id]].skills[member]
            return
        self._remove_ticket(ticket, forget_members=False)
        if len(ticket.members) == 1:
            return
        # The others wait for it again, each with its share of the party's skill.
        first = _wish_of(ticket)
        skills = {m: round(ticket.skill) for m in ticket.members if m != member}
        self._gathering[ticket.party] = _Gathering(
            ticket_id, first, skills, ticket.since, now + self.rules.party_wait
        )
        self._gathering_ids[ticket_id] = ticket.party

    def expire(self, now: float) -> list[Dropped]:
        """Parties whose members did not all arrive within `party_wait` leave the queue."""
        out = []
        for party, gathering in list(self._gathering.items()):
            if gathering.deadline <= now:
                self._drop_gathering(party)
                for m in gathering.skills:
                    del self._member[m]
                reason = "the party's members did not all arrive"
                out.append(Dropped(tuple(gathering.skills), gathering.ticket_id, reason))
        return out

    def next_deadline(self) -> float | None:
        """When `expire` next has work."""
        return min((g.deadline for g in self._gathering.values()), default=None)

    # --- matching -----------------------------------------------------------------------------

    def match(self, now: float) -> list[Match]:
        """Form every match the rules allow at `now` (oldest tickets first)."""
        out: list[Match] = []
        for key in list(self._pools):
            pool = self._pools[key]
            anchors = sorted((self._tickets[tid] for _, tid in pool), key=lambda t: t.since)
            taken: set[int] = set()
            for anchor in anchors:
                if anchor.ticket_id in taken:
                    continue
                chosen = self._fill(pool, anchor, taken, now)
                if chosen is None:
                    continue
                taken.update(t.ticket_id for t in chosen)
                out.append(Match(tuple(sorted(chosen, key=lambda t: t.since)), now))
            for ticket_id in taken:
                self._remove_ticket(self._tickets[ticket_id])
        self.matches_formed += len(out)
        return out

    def _fill(
        self, pool: list[tuple[float, int]], anchor: Ticket, taken: set[int], now: float
    ) -> list[Ticket] | None:
        """The tickets of a match around `anchor`, or None if its seats cannot be filled."""
        rules = self.rules
        need = anchor.size - len(anchor.members)
        if need == 0:
            return [anchor]
        window = rules.window(anchor.waited(now))
        wide = _accepts_other_regions(anchor, now, rules)
        # Walk outward from the anchor in skill order: the closest candidates first.
        i = bisect.bisect_left(pool, (anchor.skill, anchor.ticket_id))
        lo, hi = i - 1, i + 1
        near: list[Ticket] = []
        far: list[Ticket] = []  # other regions, taken only after the anchor's own
        seats_near = 0
        limit = anchor.size + rules.scan_limit
        while (lo >= 0 or hi < len(pool)) and len(near) + len(far) < limit:
            below = anchor.skill - pool[lo][0] if lo >= 0 else math.inf
            above = pool[hi][0] - anchor.skill if hi < len(pool) else math.inf
            if min(below, above) > window:
                break
            if below <= above:
                tid = pool[lo][1]
                lo -= 1
            else:
                tid = pool[hi][1]
                hi += 1
            if tid in taken:
                continue
            t = self._tickets[tid]
            if t.region == anchor.region:
                near.append(t)
                if len(t.members) <= need:  # (a party too big for the seats cannot count)
                    seats_near += len(t.members)
            elif wide and _accepts_other_regions(t, now, rules):
                far.append(t)
            if seats_near >= need:
                break  # enough in the anchor's region (maybe not packable; tried below)
        chosen = [anchor]
        low = high = anchor.skill
        narrowest = window
        left = need
        for t in near + far:
            if len(t.members) > left:
                continue
            new_low, new_high = min(low, t.skill), max(high, t.skill)
            new_narrowest = min(narrowest, rules.window(t.waited(now)))
            if new_high - new_low > new_narrowest:
                continue
            chosen.append(t)
            low, high, narrowest = new_low, new_high, new_narrowest
            left -= len(t.members)
            if left == 0:
                return chosen
        return None

    # --- the tables ---------------------------------------------------------------------------

    def _fresh_id(self) -> int:
        ticket_id = self._next_ticket
        self._next_ticket += 1
        return ticket_id

    def _add_ticket(
        self,
        members: tuple[str, ...],
        entry: Entry,
        skill: float,
        since: float,
        ticket_id: int | None = None,
    ) -> int:
        ticket_id = self._fresh_id() if ticket_id is None else ticket_id
        ticket = Ticket(
            ticket_id,
            members,
            entry.mode,
            entry.region,
            skill,
            entry.size,
            since,
            entry.party,
            entry.strict_region,
            entry.start,
        )
        self._tickets[ticket_id] = ticket
        if entry.party:
            self._party_ticket[entry.party] = ticket_id
        bisect.insort(self._pools.setdefault((entry.mode, entry.size), []), (skill, ticket_id))
        for m in members:
            self._member[m] = ticket_id
        return ticket_id

    def _remove_ticket(self, ticket: Ticket, *, forget_members: bool = True) -> None:
        del self._tickets[ticket.ticket_id]
        if ticket.party:
            del self._party_ticket[ticket.party]
        key = (ticket.mode, ticket.size)
        pool = self._pools[key]
        i = bisect.bisect_left(pool, (ticket.skill, ticket.ticket_id))
        del pool[i]
        if not pool:
            del self._pools[key]
        if forget_members:
            for m in ticket.members:
                if self._member.get(m) == ticket.ticket_id:
                    del self._member[m]

    def _drop_gathering(self, party: int) -> _Gathering:
        gathering = self._gathering.pop(party)
        del self._gathering_ids[gathering.ticket_id]
        return gathering


def _wish_of(ticket: Ticket) -> Entry:
    """What a ticket's members asked for (member and skill aside)."""
    return Entry(
        ticket.members[0],
        ticket.mode,
        ticket.region,
        0,
        ticket.size,
        ticket.party,
        len(ticket.members),
        ticket.strict_region,
        ticket.start,
    )


def _same_wish(a: Entry, b: Entry) -> bool:
    """Two entries that ask for the same match (skill, member and waiting time aside)."""
    return (a.mode, a.region, a.size, a.party, a.party_size, a.strict_region, a.start) == (
        b.mode,
        b.region,
        b.size,
        b.party,
        b.party_size,
        b.strict_region,
        b.start,
    )


def _accepts_other_regions(ticket: Ticket, now: float, rules: MatchRules) -> bool:
    return not ticket.strict_region and ticket.waited(now) >= rules.region_wait
