"""Admission and lifecycle bookkeeping of a session server (the io7m Aeron guide §4.3-§4.5), pure.

`Admission` owns everything a duologue holds besides its streams: two ports, a session id, a
per-address slot. It decides whether a HELLO is admitted (which never-joined duologues to evict
first), reserves and commits the resources of a new duologue in two steps (the driver binds the
streams in between, and a bind that fails gives the reservation back), checks who may join,
when a duologue expires, and releases each duologue exactly once.

The trio driver (`echo.session.server`) calls it with `now` from `trio.current_time()`; nothing
here reads a clock or touches a socket, so the decisions are tested (and mutation-tested) with
plain numbers.

Pure module: no trio, no clock, no I/O.
"""

from __future__ import annotations

import enum
from typing import Final

import attrs

from echo.protocol import (
    ERROR_SERVER_FULL,
    ERROR_TOO_MANY_FOR_IP,
    RESERVED_SESSION_HIGH,
    RESERVED_SESSION_LOW,
)
from echo.session.allocators import AllocationError, PortAllocator, RandomSource, SessionAllocator
from echo.session.config import ServerConfig
from echo.session.limits import AddressCounter, address_key
from echo.session.resume import check_proof
from echo.session.shared import SharedPorts

#: A duologue younger than this is not evicted: its client may be joining right now (a real
#: client joins within milliseconds; a spoofer's duologue is never joined).
EVICTION_GRACE: Final = 0.5


class JoinVerdict(enum.Enum):
    ACCEPT = "accept"
    WRONG_ADDRESS = "wrong address"  # not the address that said HELLO (spoofed or guessed id)
    SECOND_IMAGE = "second image"  # the owner already has a stream open on this duologue


class ResumeVerdict(enum.Enum):
    ACCEPT = "accept"
    UNKNOWN_SESSION = "unknown session"  # no live duologue has this session id
    NOT_RESUMABLE = "not resumable"  # no secret was given out, or nobody joined it yet
    BAD_PROOF = "bad proof"  # forged, or a secret of another session
    REPLAYED = "replayed"  # a counter already used (a RESUME copied off the wire)


@attrs.define(eq=False)
class Slot:
    """What one duologue holds, from its reservation to its release."""

    slot_id: int
    session_id: int
    owner_ip: str
    owner_key: str
    client_session: int
    data_port: int
    control_port: int
    created: float
    #: a stream from the owner joined (from then on it is never evicted and never expires)
    joined: bool = False
    #: in the table and counted against the owner's address (set by `commit`)
    committed: bool = False
    #: everything given back (set once, by `release` or `unreserve`)
    released: bool = False
    #: the resume secret given out in the CONNECT (None: this client cannot resume)
    resume_secret: int | None = None
    #: the highest RESUME counter accepted so far (each counter works once, in order)
    resume_counter: int = 0
    #: times the session moved to a new address
    resumes: int = 0


@attrs.frozen
class Decision:
    """What to do with a HELLO: evict these first, then admit (reason None) or refuse."""

    reason: str | None
    evict: tuple[Slot, ...] = ()


class Admission:
    """Ports, session ids, per-address counts and the table of live duologues."""

    def __init__(
        self,
        config: ServerConfig,
        rng: RandomSource | None = None,
        *,
        eviction_grace: float = EVICTION_GRACE,
    ) -> None:
        self.config = config
        self.ports: PortAllocator = (
            SharedPorts(config.clients_base_port, config.clients_base_port + 1)
            if config.shared
            else PortAllocator(config.clients_base_port, config.clients_port_count, rng)
        )
        self.sessions = SessionAllocator(RESERVED_SESSION_LOW, RESERVED_SESSION_HIGH, rng)
        self.per_ip = AddressCounter()
        #: committed duologues by slot id, oldest first (dicts keep insertion order)
        self.slots: dict[int, Slot] = {}
        #: the same committed duologues by session id (RESUME names its session)
        self.by_session: dict[int, Slot] = {}
        self.eviction_grace = eviction_grace
        self._next_id = 1

    def key_of(self, ip: str) -> str:
        """The per-address key of `ip` (IPv6 by the configured prefix), or `ip` if unparsable."""
        try:
            return address_key(ip, ipv6_prefix=self.config.ipv6_prefix)
        except ValueError:
            return ip

    # ---------------------------------------------------------------- deciding

    def decide(self, key: str, now: float) -> Decision:
        """May a HELLO from address key `key` have a duologue now?

        Full server: the oldest never-joined duologue of anyone is evicted, or "server full".
        Then the per-address limit: the oldest never-joined duologue of this key is evicted, or
        "too many connections for IP address". Joined duologues are never evicted (the guide §4.3's
        lock-out attack is beaten by evicting the spoofer's unjoined ones, not real clients).
        """
        config = self.config
        evict: list[Slot] = []
        if len(self.slots) >= config.max_clients:
            victim = self.oldest_unjoined(None, now)
            if victim is None:
                return Decision(ERROR_SERVER_FULL)
            evict.append(victim)
        held = self.per_ip.count(key) - sum(1 for slot in evict if slot.owner_key == key)
        if held >= config.max_per_ip:
            victim = self.oldest_unjoined(key, now, exclude=evict)
            if victim is None:
                return Decision(ERROR_TOO_MANY_FOR_IP)
            evict.append(victim)
        return Decision(None, tuple(evict))

    def oldest_unjoined(
        self, key: str | None, now: float, *, exclude: list[Slot] | None = None
    ) -> Slot | None:
        """The oldest duologue nobody joined, past its grace (of `key`, or of anyone if None)."""
        for slot in self.slots.values():  # oldest first
            if slot.joined or now - slot.created <= self.eviction_grace:
                continue
            if key is not None and slot.owner_key != key:
                continue
            if exclude and slot in exclude:
                continue
            return slot
        return None

    # ---------------------------------------------------------------- allocating

    def reserve(self, owner_ip: str, key: str, client_session: int, now: float) -> Slot | None:
        """Two ports and a session id for a new duologue, or None when either runs out.

        Not yet in the table nor counted: `commit` once its streams are bound, `unreserve` if
        binding failed (a port another program holds), so a failed bind never leaks a port.
        """
        try:
            data_port, control_port = self.ports.allocate_pair()
        except AllocationError:
            return None
        try:
            session_id = self.sessions.allocate()
        except AllocationError:
            self.ports.free(data_port)
            self.ports.free(control_port)
            return None
        slot = Slot(
            slot_id=self._next_id,
            session_id=session_id,
            owner_ip=owner_ip,
            owner_key=key,
            client_session=client_session,
            data_port=data_port,
            control_port=control_port,
            created=now,
        )
        self._next_id += 1
        return slot

    def unreserve(self, slot: Slot) -> None:
        """Give back a reservation that was never committed (its streams could not be bound)."""
        if slot.committed or slot.released:
            raise ValueError(f"slot {slot.slot_id} is committed or already released")
        slot.released = True
        self.ports.free(slot.data_port)
        self.ports.free(slot.control_port)
        self.sessions.free(slot.session_id)

    def commit(self, slot: Slot) -> None:
        """The duologue exists: into the table, and counted against its owner's address."""
        if slot.committed or slot.released:
            raise ValueError(f"slot {slot.slot_id} is already committed or released")
        slot.committed = True
        self.per_ip.increment(slot.owner_key)
        self.slots[slot.slot_id] = slot
        self.by_session[slot.session_id] = slot

    def release(self, slot: Slot) -> bool:
        """Free everything `slot` holds; True the first time, False on every later call."""
        if slot.released:
            return False
        if not slot.committed:
            self.unreserve(slot)
            return True
        slot.released = True
        del self.slots[slot.slot_id]
        del self.by_session[slot.session_id]
        self.ports.free(slot.data_port)
        self.ports.free(slot.control_port)
        self.sessions.free(slot.session_id)
        self.per_ip.decrement(slot.owner_key)
        return True

    # ---------------------------------------------------------------- joining, expiry

    def join(self, slot: Slot, source_ip: str, *, has_stream: bool) -> JoinVerdict:
        """May a stream from `source_ip` join `slot`? Marks it joined if so.

        Only the address that said HELLO may join (the guide's code accepted anyone who knew or
        guessed the session id), and only one stream at a time.
        """
        if source_ip != slot.owner_ip:
            return JoinVerdict.WRONG_ADDRESS
        if has_stream:
            return JoinVerdict.SECOND_IMAGE
        slot.joined = True
        return JoinVerdict.ACCEPT

    def expires_at(self, slot: Slot) -> float:
        """When `slot` is deleted if nobody has joined it by then."""
        return slot.created + self.config.duologue_expiry

    def is_expired(self, slot: Slot, now: float) -> bool:
        return not slot.joined and now >= self.expires_at(slot)

    # ---------------------------------------------------------------- resuming

    def resume(
        self,
        session_id: int,
        counter: int,
        received: int,
        proof: bytes,
        source_ip: str,
        key: str,
    ) -> tuple[ResumeVerdict, Slot | None]:
        """May the sender of a RESUME (from `source_ip`) have session `session_id` back?

        On ACCEPT the duologue now belongs to `source_ip`: only streams from there may join it,
        and its per-address slot moved to `key`. The session was never free meanwhile: its id,
        ports and slot stay allocated until it is released, whoever asks.
        """
        slot = self.by_session.get(session_id)
        if slot is None:
            return ResumeVerdict.UNKNOWN_SESSION, None
        if slot.resume_secret is None or not slot.joined:
            return ResumeVerdict.NOT_RESUMABLE, slot
        if not check_proof(slot.resume_secret, session_id, counter, received, proof):
            return ResumeVerdict.BAD_PROOF, slot
        if counter <= slot.resume_counter:
            return ResumeVerdict.REPLAYED, slot
        slot.resume_counter = counter
        slot.resumes += 1
        if key != slot.owner_key:
            self.per_ip.decrement(slot.owner_key)
            self.per_ip.increment(key)
        slot.owner_ip = source_ip
        slot.owner_key = key
        return ResumeVerdict.ACCEPT, slot
