"""A lobby server's publications use the lobby's term length (echo.lobby.timers), and the
lobby's largest messages still go through them."""

from __future__ import annotations

import attrs

import echo.lobby
from echo.lobby.timers import LOBBY_TERM_LENGTH
from echo.session.server import ALL_CLIENTS_TERM_LENGTH
from tests.lobby.servers import LOBBY, cluster


async def test_member_sessions_have_the_lobbys_terms_and_carry_large_lobbies() -> None:
    # Metadata of 200 KB: a snapshot larger than a 1 MiB term could carry (term / 8).
    big = attrs.evolve(
        LOBBY, max_metadata_keys=40, max_value_bytes=8192, max_metadata_bytes=400_000
    )
    metadata = {f"k{i:02d}": chr(ord("a") + i % 26) * 8000 for i in range(25)}
    async with cluster(1, lobby=big) as c:
        servers = c.names
        async with (
            echo.lobby.connect(servers, member="alice") as alice,
            echo.lobby.connect(servers, member="bob") as bob,
        ):
            lobby_id = await alice.create("room", 4, metadata=metadata)
            assert await bob.join(lobby_id) == lobby_id
            assert bob.replica is not None and bob.replica.metadata == metadata
            driver = c.lobby[0].sessions.transport._driver  # (no public view of it)
            terms = sorted(p.term_length for p in driver.publications())
    # The all-clients publication has its own (smaller) terms; every member's session, the
    # lobby's.
    assert terms[0] == ALL_CLIENTS_TERM_LENGTH
    assert terms[1:] == [LOBBY_TERM_LENGTH] * (len(terms) - 1) and len(terms) >= 3
