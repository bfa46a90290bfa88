"""How the driver wires publications: the session ids in use (wiring.StreamIds).

The transport refuses a publication whose explicit `session-id=` clashes with an open one, and
picks automatic ids among those not in use. It keeps a count per id in use rather than looking
at every publication on each open (O(publications) per duologue opened, 3 % of a lobby
server's join CPU at 4,000 members); these tests pin that the count follows publications
closing as well as opening.
"""

from __future__ import annotations

import random

import pytest
import trio
import trio.testing

from echo.transport import TransportConfig, open_transport
from echo.transport.core.uri import UriError
from echo.transport.driver.loop import Driver
from echo.transport.driver.wiring import StreamIds
from echo.transport.testing import MemoryNetwork

STREAM = 1001
CHANNEL = "aeron:udp?endpoint=127.0.0.1:40123"


def test_a_released_session_id_is_free_again_and_a_shared_one_only_when_all_are_gone() -> None:
    ids = StreamIds(TransportConfig(), random.Random(3))
    first = ids.next_session_id()
    ids.claim_session(first)
    assert ids.session_in_use(first)
    second = ids.next_session_id()
    assert second != first
    ids.claim_session(first)  # counted twice: one release leaves it in use
    ids.release_session(first)
    assert ids.session_in_use(first)
    ids.release_session(first)
    assert not ids.session_in_use(first)
    ids.release_session(first)  # a release too many does not go negative
    ids.claim_session(first)
    assert ids.session_in_use(first)
    ids.release_all_sessions()
    assert not ids.session_in_use(first)


def test_automatic_ids_skip_the_ones_in_use() -> None:
    # Two generators from the same seed pick the same sequence: the one that has the first
    # two ids in use skips them.
    config = TransportConfig()
    plain, busy = StreamIds(config, random.Random(9)), StreamIds(config, random.Random(9))
    expected = [plain.next_session_id() for _ in range(3)]
    busy.claim_session(expected[0])
    busy.claim_session(expected[1])
    assert busy.next_session_id() == expected[2]


async def test_a_closed_publications_session_id_is_free_and_a_clash_is_still_refused(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    def every_publication(self: Driver) -> list[object]:
        raise AssertionError("opening a publication looked at every publication")

    monkeypatch.setattr(Driver, "publications", every_publication)
    async with open_transport(socket_factory=MemoryNetwork()) as transport:
        pub = await transport.add_publication(f"{CHANNEL}|session-id=7", STREAM)
        with pytest.raises(UriError, match="clashing session-id 7"):
            await transport.add_publication(f"{CHANNEL}|session-id=7", STREAM + 1)
        # On another channel (another socket) too: session ids are the transport's.
        with pytest.raises(UriError, match="clashing session-id 7"):
            await transport.add_publication("aeron:udp?endpoint=127.0.0.1:40124|session-id=7", 1)
        automatic = await transport.add_publication(CHANNEL, STREAM + 2)
        assert automatic.session_id != 7
        with pytest.raises(UriError, match="clashing session-id"):
            await transport.add_publication(
                f"{CHANNEL}|session-id={automatic.session_id}", STREAM + 3
            )
        await pub.close(timeout=0.1)
        again = await transport.add_publication(f"{CHANNEL}|session-id=7", STREAM)
        assert again.session_id == 7
        await automatic.close(timeout=0.1)
        reused = await transport.add_publication(
            f"{CHANNEL}|session-id={automatic.session_id}", STREAM + 3
        )
        assert reused.session_id == automatic.session_id
