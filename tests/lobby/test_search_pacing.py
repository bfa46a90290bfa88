"""`search_all` walks every page under the server's search rate limit instead of failing part-way:
the refusal names its wait, the client honours it, and the total wait is bounded."""

from __future__ import annotations

import contextlib

import attrs
import pytest
import trio

import echo.lobby
from echo.lobby.client import LobbyError, retry_after
from echo.lobby.limits import RateLimit, TokenBucket
from echo.lobby.protocol import ErrorCode, SearchLobbies
from tests.lobby.lab import CONFIG, Lab
from tests.lobby.servers import LOBBY, cluster

SLOW = RateLimit(rate=4.0, burst=2)


def test_a_bucket_says_when_its_next_token_comes() -> None:
    bucket = TokenBucket(SLOW, now=0.0)
    assert bucket.wait(0.0) == 0.0
    assert bucket.take(0.0) and bucket.take(0.0)
    assert bucket.wait(0.0) == pytest.approx(0.25)
    assert bucket.wait(0.1) == pytest.approx(0.15)
    assert not bucket.take(0.2)
    assert bucket.take(0.25)


def test_a_rate_limited_refusal_names_the_wait_and_the_client_reads_it() -> None:
    lab = Lab(attrs.evolve(CONFIG, search_limit=SLOW))
    for _ in range(2):
        lab.ok("s", SearchLobbies(lab.rid(), (), None, 10))
    lab.now = 0.05
    refusal = lab.refused("s", SearchLobbies(lab.rid(), (), None, 10), ErrorCode.RATE_LIMITED)
    assert refusal.message.endswith("(retry in 0.200 s)")
    assert retry_after(refusal.message) == pytest.approx(0.21)
    # A server that names no wait: one interval of the default search limit (1 per second).
    assert retry_after("too many search requests; slow down") == pytest.approx(1.01)
    assert retry_after("retry in 5 s, or not") == pytest.approx(1.01)  # not at the end: no


async def _members_with_lobbies(c: object, n: int, stack: contextlib.AsyncExitStack) -> set[int]:
    made = set()
    for i in range(n):
        m = await stack.enter_async_context(
            echo.lobby.connect(c.names, member=f"m{i}", reconnect=False)  # type: ignore[attr-defined]
        )
        made.add(await m.create(f"room {i}", 4))
    return made


async def test_search_all_paces_itself_under_a_real_server_s_limit() -> None:
    async with cluster(1, lobby=attrs.evolve(LOBBY, search_limit=SLOW)) as c:
        async with contextlib.AsyncExitStack() as stack:
            made = await _members_with_lobbies(c, 10, stack)
            async with echo.lobby.connect(c.names, member="searcher") as s:
                started = trio.current_time()
                found = await s.search_all(limit=2)  # 5 pages, a burst of 2
                took = trio.current_time() - started
                assert sorted(listing.lobby_id for listing in found) == sorted(made)
                # Three pages had to wait for a token each (a quarter of a second).
                assert took >= 3 * 0.25 - 0.05
                refused = c.lobby[0].registry.refusals[ErrorCode.RATE_LIMITED]
                assert refused >= 3
                # Bounded: a walk that would wait longer than allowed says so.
                with pytest.raises(LobbyError) as caught:
                    await s.search_all(limit=1, max_wait=0.3)
                assert caught.value.code is ErrorCode.RATE_LIMITED
