"""A pure sender/receiver pair wired by hand, with a scripted clock (docs/architecture.md,
Test layers).

`PairLink` owns a unicast `SendEndpoint` (one `NetworkPublication`, remote `RECEIVER_ADDRESS`) and a
`ReceiveEndpoint` (one `StreamInterest`). Nothing moves unless the test moves it: `now` is a
float the test advances, polls hand datagrams to two queues, and `deliver()` carries them across,
where a *fate* decides, per datagram, whether it is dropped, duplicated or held back (delivered
after the next round: reordering). Fates are decided by packet index (`by_index`) or by a seeded
`random.Random` (`seeded`). Every datagram is recorded in `trace` with its time and fate.

`run_until(predicate, max_time)` is the event loop: poll both sides and deliver until nothing
moves, drain messages from the images (like `Subscription.poll`), then advance `now` to the
earliest deadline of either endpoint (at least `min_step` later) and repeat.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Literal

import attrs

from echo.transport.core.counters import Counters
from echo.transport.core.flow_control import UnicastFlowControl
from echo.transport.core.frames import (
    DataHeader,
    Frame,
    FrameError,
    parse_datagram_untrusted,
)
from echo.transport.core.receiver import (
    DEFAULT_RECEIVER_WINDOW,
    ImageAvailable,
    ImageEvent,
    ImageUnavailable,
    PublicationImage,
    ReceiveEndpoint,
    ReceiverTimers,
    StreamInterest,
)
from echo.transport.core.sender import (
    NetworkPublication,
    SendEndpoint,
    SenderTimers,
    SendMode,
)

Direction = Literal["data", "control"]  # data: sender -> receiver; control: receiver -> sender

RECEIVER_ADDRESS = ("r", 1)  # the subscription's data socket
SENDER_ADDRESS = ("s", 2)  # the publication's socket, as the receiver sees it
RECEIVER_ID = 0x1234_5678_9ABC


@attrs.frozen
class Fate:
    """What the network does to one datagram: `copies` 0 drops it, 2 duplicates it; `hold`
    delays it to the next delivery round, after datagrams sent later (reordering)."""

    copies: int = 1
    hold: bool = False


DELIVER = Fate()
DROP = Fate(copies=0)
DUPLICATE = Fate(copies=2)
HOLD = Fate(hold=True)

FateFn = Callable[[Direction, int, bytes], Fate]


def by_index(
    *,
    drop: set[int] | None = None,
    duplicate: set[int] | None = None,
    hold: set[int] | None = None,
    direction: Direction = "data",
) -> FateFn:
    """Fates by the 0-based index of the datagram in one direction; the other is lossless."""
    drop, duplicate, hold = drop or set(), duplicate or set(), hold or set()

    def fate(which: Direction, index: int, datagram: bytes) -> Fate:
        if which != direction:
            return DELIVER
        if index in drop:
            return DROP
        return Fate(copies=2 if index in duplicate else 1, hold=index in hold)

    return fate


def seeded(
    rng: random.Random,
    *,
    loss: float = 0.0,
    duplicate: float = 0.0,
    reorder: float = 0.0,
    control_loss: float | None = None,
) -> FateFn:
    """Independent random fates in both directions (control loss defaults to `loss`)."""
    control = loss if control_loss is None else control_loss

    def fate(which: Direction, index: int, datagram: bytes) -> Fate:
        if rng.random() < (loss if which == "data" else control):
            return DROP
        copies = 2 if rng.random() < duplicate else 1
        return Fate(copies=copies, hold=rng.random() < reorder)

    return fate


def lossless(which: Direction, index: int, datagram: bytes) -> Fate:
    return DELIVER


@attrs.define
class Sent:
    """One datagram handed to the network."""

    time: float
    direction: Direction
    index: int
    data: bytes
    address: object
    fate: Fate

    @property
    def frame(self) -> Frame:
        return parse_datagram_untrusted(self.data)


class PairLink:
    def __init__(
        self,
        *,
        term_length: int = 64 * 1024,
        mtu: int = 1408,
        initial_term_id: int = 0,
        session_id: int = 0x1EE7,
        stream_id: int = 1001,
        rcv_wnd: int = DEFAULT_RECEIVER_WINDOW,
        session_filter: int | None = None,
        reliable: bool = True,
        fate: FateFn = lossless,
        now: float = 0.0,
        sender_timers: SenderTimers | None = None,
        receiver_timers: ReceiverTimers | None = None,
        max_retransmits: int | None = None,
        term_window: int | None = None,
        min_step: float = 0.0001,
        seed: int = 0,
    ) -> None:
        self.now = now
        self.min_step = min_step
        self.fate = fate
        self.stream_id = stream_id
        self.sender_counters = Counters()
        self.receiver_counters = Counters()
        self.send_endpoint = SendEndpoint(
            mode=SendMode.UNICAST, counters=self.sender_counters, remote=RECEIVER_ADDRESS
        )
        self.publication = NetworkPublication(
            session_id=session_id,
            stream_id=stream_id,
            initial_term_id=initial_term_id,
            term_length=term_length,
            mtu=mtu,
            flow_control=UnicastFlowControl(),
            counters=self.sender_counters,
            now=now,
            timers=sender_timers,
            max_retransmits=max_retransmits,
            term_window=term_window,
        )
        self.send_endpoint.add(self.publication)
        self.receive_endpoint = ReceiveEndpoint(
            counters=self.receiver_counters,
            receiver_id=RECEIVER_ID,
            now=now,
            timers=receiver_timers,
            rng=random.Random(seed),
        )
        self.receive_endpoint.add_interest(
            StreamInterest(
                stream_id=stream_id, session_id=session_filter, rcv_wnd=rcv_wnd, reliable=reliable
            ),
            now,
        )
        self.trace: list[Sent] = []
        self._counts: dict[Direction, int] = {"data": 0, "control": 0}
        self._queues: dict[Direction, list[bytes]] = {"data": [], "control": []}
        self._held: dict[Direction, list[bytes]] = {"data": [], "control": []}
        self.misdirected: list[Sent] = []
        #: messages delivered by the images, per session id, in delivery order
        self.received: dict[int, list[bytes]] = {}
        self.events: list[ImageEvent] = []
        self.consuming = True
        self.fragment_limit = 64

    # ------------------------------------------------------------------ the network

    def _send(self, direction: Direction, datagram: bytes | memoryview, address: object) -> bool:
        # Copy now: the sender hands out views of its term, which later writes may change.
        data = bytes(datagram)
        index = self._counts[direction]
        self._counts[direction] = index + 1
        fate = self.fate(direction, index, data)
        sent = Sent(self.now, direction, index, data, address, fate)
        self.trace.append(sent)
        expected = RECEIVER_ADDRESS if direction == "data" else SENDER_ADDRESS
        if address != expected:
            self.misdirected.append(sent)
            return True
        target = self._held[direction] if fate.hold else self._queues[direction]
        target.extend([data] * fate.copies)
        return True

    def sender_send(self, datagram: bytes | memoryview, address: object) -> bool:
        return self._send("data", datagram, address)

    def receiver_send(self, datagram: bytes | memoryview, address: object) -> bool:
        return self._send("control", datagram, address)

    def deliver(self) -> int:
        """Carry every queued datagram across (held ones from the previous round last)."""
        moved = 0
        for direction in ("data", "control"):
            queue = self._queues[direction] + self._held[direction]
            self._queues[direction] = []
            self._held[direction] = []
            for data in queue:
                moved += 1
                if direction == "data":
                    self.receive_endpoint.on_datagram(data, SENDER_ADDRESS, self.now)
                else:
                    self.send_endpoint.on_datagram(data, RECEIVER_ADDRESS, self.now)
        return moved

    def inject_to_receiver(self, datagram: bytes, source: object = SENDER_ADDRESS) -> None:
        self.receive_endpoint.on_datagram(datagram, source, self.now)

    def inject_to_sender(self, datagram: bytes, source: object = RECEIVER_ADDRESS) -> None:
        self.send_endpoint.on_datagram(datagram, source, self.now)

    # ------------------------------------------------------------------ the two sides

    def poll_sender(self) -> None:
        self.send_endpoint.poll(self.now, self.sender_send)

    def poll_receiver(self) -> None:
        self.receive_endpoint.poll(self.now, self.receiver_send)
        self.events.extend(self.receive_endpoint.take_events())

    @property
    def images(self) -> list[PublicationImage]:
        return list(self.receive_endpoint.images.values())

    @property
    def image(self) -> PublicationImage:
        (image,) = self.receive_endpoint.images.values()
        return image

    def drain(self) -> int:
        """Consume every complete message, as `Subscription.poll` would."""
        if not self.consuming:
            return 0
        total = 0
        for image in self.images:
            box = self.received.setdefault(image.session_id, [])
            while True:
                before = image.subscriber_position
                fragments = image.poll_messages(box.append, self.fragment_limit)
                total += fragments
                # A PAD frame counts no fragment but moves the position: go on into the next term.
                if image.subscriber_position == before:
                    break
            if image.status_message_due():
                self.receive_endpoint.touch(image.session_id, image.stream_id)
        return total

    def pump(self, rounds: int = 10_000) -> None:
        """Poll, deliver and drain at the current `now` until nothing moves."""
        for _ in range(rounds):
            before = len(self.trace)
            self.poll_sender()
            self.poll_receiver()
            moved = self.deliver()
            consumed = self.drain()
            if not moved and not consumed and len(self.trace) == before:
                return
        raise AssertionError(f"pair did not settle at t={self.now}")

    def next_deadline(self) -> float:
        return min(
            self.send_endpoint.next_deadline(self.now),
            self.receive_endpoint.next_deadline(self.now),
        )

    def step(self) -> None:
        """Settle at `now`, then advance to the next deadline (at least `min_step`)."""
        self.pump()
        deadline = self.next_deadline()
        if math.isinf(deadline):
            deadline = self.now + 1.0
        self.now = self._next_time(deadline)

    def _next_time(self, deadline: float) -> float:
        # Exactly the deadline if it is ahead; a small step if something claims to be due now
        # but did nothing when polled (a timer that rounds to now).
        return deadline if deadline > self.now else self.now + self.min_step

    def advance(self, seconds: float) -> None:
        """Run the pair until `now` has moved `seconds` on (stopping exactly there)."""
        end = self.now + seconds
        while True:
            self.pump()
            deadline = self.next_deadline()
            target = self._next_time(deadline)
            if target >= end:
                self.now = end
                self.pump()
                return
            self.now = target

    def run_until(self, predicate: Callable[[], bool], max_time: float = 30.0) -> float:
        """Step until `predicate()` holds; fails after `max_time` scripted seconds."""
        limit = self.now + max_time
        while True:
            self.pump()
            if predicate():
                return self.now
            if self.now >= limit:
                raise AssertionError(f"condition not reached within {max_time} s (t={self.now})")
            deadline = self.next_deadline()
            if math.isinf(deadline):
                deadline = self.now + 1.0
            self.now = min(self._next_time(deadline), limit)

    def connect(self, max_time: float = 1.0) -> None:
        """SETUP, image, first SM: until the publication is connected."""
        self.run_until(lambda: self.publication.is_connected(self.now), max_time)

    # ------------------------------------------------------------------ the application

    def offer(self, data: bytes) -> int:
        """Offer once, retrying once after ADMIN_ACTION (a term rotation)."""
        result = self.publication.offer(data, self.now)
        if result == -3:
            result = self.publication.offer(data, self.now)
        return result

    def offer_all(self, messages: list[bytes], max_time: float = 60.0) -> None:
        """Offer every message, running the pair whenever the publication pushes back."""
        pending = list(reversed(messages))
        limit = self.now + max_time
        while pending:
            result = self.publication.offer(pending[-1], self.now)
            if result > 0:
                pending.pop()
                continue
            if result == -3:
                continue
            if result not in (-1, -2):
                raise AssertionError(f"offer failed with {result}")
            if self.now >= limit:
                raise AssertionError(f"offers still back-pressured after {max_time} s")
            self.step()

    def sent(self, direction: Direction) -> list[Sent]:
        return [s for s in self.trace if s.direction == direction]

    def data_headers(self) -> list[tuple[float, DataHeader]]:
        """Every DATA/PAD datagram the sender emitted (first header), with its time."""
        out = []
        for s in self.sent("data"):
            frame = s.frame
            if isinstance(frame, DataHeader):
                out.append((s.time, frame))
        return out

    def frames(self, direction: Direction) -> list[tuple[float, Frame]]:
        out = []
        for s in self.sent(direction):
            try:
                out.append((s.time, s.frame))
            except FrameError as error:  # pragma: no cover - the pair only sends valid frames
                raise AssertionError(f"invalid frame sent: {error}") from None
        return out

    def available_images(self) -> list[PublicationImage]:
        return [e.image for e in self.events if isinstance(e, ImageAvailable)]

    def unavailable_images(self) -> list[ImageUnavailable]:
        return [e for e in self.events if isinstance(e, ImageUnavailable)]
