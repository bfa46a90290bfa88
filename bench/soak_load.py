"""The load of the soak (bench/soak.py): what its clients do, each counting every outcome.

- `echo_churn`: sessions through the session library against `echo-server`, opened and closed
  without pause, `ECHOES` round trips each;
- `lobby_churn`: groups of lobby members on the lobby ring: the owner creates a lobby, the
  others join by id, every member chats, one member crashes (its client goes without leaving)
  and a new client takes its seat back with the resume token, everyone chats again, and all
  leave; every chat line must reach every other member seated when it was sent;
- `topics_churn`: a subscriber and a publisher on the topics servers, every message counted;
- `spray`: random datagrams (some with a plausible frame header) at every UDP port of every
  server.

Outcomes go into one `Counter` by name; a name ending in ``_lost`` or ``_failed`` counts
something that should never happen, and the soak's summary lists them.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import socket
import struct
import traceback
from collections import Counter
from collections.abc import Sequence
from typing import Any

import structlog
import trio

log = structlog.get_logger("bench.soak")

ECHOES = 5
#: seconds a chat line may take to reach every member before it counts as lost
CHAT_WAIT = 10.0
#: members per lobby of the lobby churn
GROUP = 4


def _kind(error: BaseException) -> str:
    return type(error).__name__


async def echo_churn(
    outcomes: Counter[str], port: int, control_port: int, stop_at: float, transport: Any
) -> None:
    """One worker: sessions one after the other until `stop_at` (trio time)."""
    import echo.session as es
    from echo.protocol import Echo, format_message

    while trio.current_time() < stop_at:
        try:
            async with es.connect(
                "127.0.0.1",
                port,
                control_port,
                transport=transport,
                timeout=10.0,
                duologue_ports="shared",
            ) as session:
                for i in range(ECHOES):
                    sent = format_message(Echo(f"soak {i}"))
                    await session.send(sent)
                    if await session.receive() != sent:
                        outcomes["echo_reply_failed"] += 1
            outcomes["echo_sessions"] += 1
        except Exception as error:  # counted, and the churn goes on
            outcomes["echo_session_failed"] += 1
            outcomes[f"echo_error_{_kind(error)}"] += 1


class _Member:
    """One lobby member's client and the chat lines it saw."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.client: Any = None
        self.seen: set[str] = set()
        self.changed = trio.Event()
        self.failovers = 0

    async def read(self, client: Any) -> None:
        from echo.lobby.client import Reconnected, Rehomed
        from echo.lobby.protocol import ChatLine

        async for event in client.events():
            if isinstance(event, ChatLine):
                self.seen.add(event.text)
                self.changed.set()
                self.changed = trio.Event()
            elif isinstance(event, Rehomed | Reconnected):
                # The session to the home dropped (a starved machine misses the 2.5 s
                # liveness): a failover, counted, and told apart in what it loses.
                self.failovers += 1

    async def wait_for(self, texts: set[str]) -> set[str]:
        """The texts of `texts` that did not arrive within `CHAT_WAIT`."""
        with trio.move_on_after(CHAT_WAIT):
            while not texts <= self.seen:
                await self.changed.wait()
        return texts - self.seen


@contextlib.asynccontextmanager
async def _seated(
    member: _Member, servers: Sequence[str], transport: Any, resume: bytes | None = None
) -> Any:
    import echo.lobby

    async with echo.lobby.connect(
        servers, member=member.name, transport=transport, resume_token=resume
    ) as client:
        member.client = client
        async with trio.open_nursery() as nursery:
            nursery.start_soon(member.read, client)
            try:
                yield client
            finally:
                nursery.cancel_scope.cancel()


async def _chat_round(members: list[_Member], tag: str, outcomes: Counter[str]) -> None:
    """Every member says one line; every member must see every other member's line."""
    sent: dict[str, str] = {}
    for member in members:
        text = f"{tag} from {member.name}"
        await member.client.chat(text)
        sent[member.name] = text
        outcomes["chat_lines_sent"] += 1
    for member in members:
        wanted = {text for name, text in sent.items() if name != member.name}
        missing = await member.wait_for(wanted)
        outcomes["chat_deliveries"] += len(wanted) - len(missing)
        if any(m.failovers for m in members):
            outcomes["chat_lines_lost_in_failover"] += len(missing)
        else:
            outcomes["chat_lines_lost"] += len(missing)


async def lobby_cycle(
    outcomes: Counter[str], servers: Sequence[str], transport: Any, group: int, cycle: int
) -> None:
    """One lobby's life: create, join, chat, crash and resume, chat, leave."""
    members = [_Member(f"g{group}c{cycle}m{i}") for i in range(GROUP)]
    crashed = members[-1]
    async with contextlib.AsyncExitStack() as stack:
        owner = await stack.enter_async_context(_seated(members[0], servers, transport))
        lobby_id = await owner.create(f"soak {group}/{cycle}", max_members=GROUP)
        outcomes["lobbies_created"] += 1
        for member in members[1:-1]:
            client = await stack.enter_async_context(_seated(member, servers, transport))
            await client.join(lobby_id)
            outcomes["members_joined"] += 1
        async with _seated(crashed, servers, transport) as client:
            await client.join(lobby_id)
            outcomes["members_joined"] += 1
            await _chat_round(members, f"{group}/{cycle} one", outcomes)
            with trio.fail_after(CHAT_WAIT):
                await client.wait_until(lambda c: c.resume_token is not None)
            token = client.resume_token
        # The crash: that client went without leaving (its seat stays for the grace period);
        # a new client takes the seat back with the resume token.
        async with _seated(crashed, servers, transport, resume=token) as client:
            outcomes["members_resumed"] += 1
            await _chat_round(members, f"{group}/{cycle} two", outcomes)
            await client.leave()
        for member in members[:-1]:
            await member.client.leave()
        outcomes["lobby_cycles"] += 1
    outcomes["lobby_failovers"] += sum(m.failovers for m in members)


async def lobby_churn(
    outcomes: Counter[str], servers: Sequence[str], stop_at: float, group: int, transport: Any
) -> None:
    """One group: lobby cycles one after the other until `stop_at`."""
    cycle = 0
    while trio.current_time() < stop_at:
        try:
            await lobby_cycle(outcomes, servers, transport, group, cycle)
        except Exception as error:  # counted, and the churn goes on: a soak runs for hours
            outcomes["lobby_cycle_failed"] += 1
            if "dropped" in str(error) or "lost contact" in str(error):
                outcomes["lobby_cycle_failed_session_dropped"] += 1
            outcomes[f"lobby_error_{_kind(error)}"] += 1
            # where in the cycle (the line of lobby_cycle), for whoever reads the log
            step = next(
                (f"{frame.lineno}: {frame.line}" for frame in reversed(
                    traceback.extract_tb(error.__traceback__)) if frame.name == "lobby_cycle"),
                "?",
            )  # fmt: skip
            call = re.search(r"\.(\w+)\(", step)
            outcomes[f"lobby_failed_in_{call.group(1) if call else 'other'}"] += 1
            log.warning(
                "lobby_cycle_failed", group=group, cycle=cycle, error=repr(error), step=step
            )
        cycle += 1


async def topics_churn(
    outcomes: Counter[str], servers: Sequence[str], stop_at: float, interval: float = 0.5
) -> None:
    """A subscriber and a publisher on one topic: every message published must arrive."""
    from echo.topics import open_topic_client

    topic = f"soak/{os.getpid()}"
    published: set[bytes] = set()
    received: set[bytes] = set()
    async with open_topic_client(servers) as subscriber, open_topic_client(servers) as publisher:
        subscriber.subscribe(topic)
        with trio.fail_after(30):
            await subscriber.wait_subscribed(topic)

        all_in = trio.Event()
        done_publishing = False

        async def receive() -> None:
            async for message in subscriber.messages():
                received.add(message.data)
                if done_publishing and published <= received:
                    all_in.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(receive)
            n = 0
            while trio.current_time() < stop_at:
                data = f"message {n}".encode()
                publisher.publish(topic, data)
                published.add(data)
                n += 1
                await trio.sleep(interval)
            await publisher.wait_sent()
            done_publishing = True
            if published <= received:
                all_in.set()
            with trio.move_on_after(10):
                await all_in.wait()
            nursery.cancel_scope.cancel()
    outcomes["topic_messages_published"] += len(published)
    outcomes["topic_messages_received"] += len(published & received)
    outcomes["topic_messages_lost"] += len(published - received)


async def spray(
    outcomes: Counter[str], targets: Sequence[int], stop_at: float, rate: float, seed: int = 14
) -> None:
    """`rate` random datagrams a second at `targets` (UDP ports on 127.0.0.1)."""
    rng = random.Random(seed)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.setblocking(False)
        tick = 0.05
        next_at = trio.current_time()
        owed = 0.0
        while trio.current_time() < stop_at:
            owed += rate * tick
            while owed >= 1.0:
                owed -= 1.0
                size = rng.randrange(0, 200)
                data = bytearray(os.urandom(size))
                if size >= 8 and rng.random() < 0.5:
                    struct.pack_into("<iBBH", data, 0, size, 0, 0xC0, rng.choice((1, 2, 3, 5)))
                try:
                    sock.sendto(bytes(data), ("127.0.0.1", rng.choice(targets)))
                    outcomes["garbage_sent"] += 1
                except OSError:
                    outcomes["garbage_not_sent"] += 1
            next_at += tick
            await trio.sleep_until(next_at)
