"""S1 (lobby search, in process): a registry's search from its index against a scan, same run.

One `LobbyRegistry` holds `--lobbies` public lobbies of 8 members (mode one of four, skill
0..99, every lobby full, as L1's are once seated). Each query is asked `--searches` times:

- index: the page from a `SearchIndex` (echo.lobby.search_index) of the registry's listings,
  as the registry's search takes it;
- scan: the same page cut from every listed lobby's listing in id order, each checked with the
  same rule (`listing_matches`) until the page is full: what search cost before the index;
- request: the whole request through `registry.handle(SearchLobbies(...))` (the rate limit,
  the checks, the search, the reply), no baseline: what a search costs the server's core.

Queries: L1's (`mode` equals one of four values, first page of 20), the same with a free seat
asked for (every lobby is full: nothing matches), a narrow `skill` range, and an unfiltered
page. Figures are microseconds per search, the scan's of the same repeat as the baseline.
This isolates the search itself; L1 (bench.lobby_bench) measures it over the network next to
Colyseus.

`python -m bench.search_bench` (10,000 lobbies, 3 repeats).
"""

from __future__ import annotations

import argparse
import itertools
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from itertools import islice
from pathlib import Path

from bench import results as result_files
from bench.harness import Result
from echo.lobby.limits import LobbyConfig, RateLimit
from echo.lobby.protocol import (
    CreateLobby,
    Filter,
    FreeSlots,
    JoinLobby,
    LobbyListing,
    NumberRange,
    SearchLobbies,
    SearchResults,
    StringEquals,
)
from echo.lobby.search_index import SearchIndex, listing_matches
from echo.lobby.state import LobbyRegistry

MODES = ("ffa", "duel", "team", "coop")
QUERIES: dict[str, tuple[Filter, ...]] = {
    "mode page": (StringEquals("mode", "duel"),),
    "mode, free seat (none)": (StringEquals("mode", "duel"), FreeSlots(1)),
    "skill range": (NumberRange("skill", 40, 40),),
    "unfiltered page": (),
}
LIMIT = 20


def build(lobbies: int, members: int) -> LobbyRegistry:
    unlimited = RateLimit(1e12, 1e12)
    config = LobbyConfig(
        max_lobbies=lobbies,
        indexed_keys=frozenset({"mode", "skill"}),
        create_limit=unlimited,
        join_limit=unlimited,
        search_limit=unlimited,
    )
    ids = itertools.count(1)
    registry = LobbyRegistry(config, new_lobby_id=lambda: next(ids))
    rid = itertools.count(1)
    for i in range(lobbies):
        meta: dict[str, str | int] = {"mode": MODES[i % len(MODES)], "skill": i % 100}
        registry.handle(f"o{i}", CreateLobby(next(rid), f"room {i}", members, False, meta), 0.0)
        for j in range(members - 1):
            registry.handle(f"m{i}-{j}", JoinLobby(next(rid), i + 1), 0.0)
    return registry


def scan_page(listings: Sequence[LobbyListing], filters: tuple[Filter, ...]) -> list[int]:
    return [x.lobby_id for x in islice((x for x in listings if listing_matches(x, filters)), LIMIT)]


def index_page(index: SearchIndex, filters: tuple[Filter, ...]) -> list[int]:
    return [x.lobby_id for x in islice(index.matching(filters), LIMIT)]


def per_search_us(ask: Callable[[], object], searches: int) -> float:
    start = time.perf_counter()
    for _ in range(searches):
        ask()
    return (time.perf_counter() - start) / searches * 1e6


def one_repeat(registry: LobbyRegistry, searches: int) -> dict[tuple[str, str], Result]:
    listings = registry.listings()  # ascending id, as the scan walked them
    index = SearchIndex()
    for listing in listings:
        index.put(listing)
    figures: dict[tuple[str, str], Result] = {}
    for name, filters in QUERIES.items():
        request = SearchLobbies(1, filters, None, LIMIT)
        reply = registry.handle("searcher", request, 0.0).reply
        assert isinstance(reply, SearchResults)
        page = scan_page(listings, filters)
        assert [x.lobby_id for x in reply.listings] == page == index_page(index, filters), name

        def scan(fs: tuple[Filter, ...] = filters) -> object:
            return scan_page(listings, fs)

        def indexed(fs: tuple[Filter, ...] = filters) -> object:
            return index_page(index, fs)

        def whole(r: SearchLobbies = request) -> object:
            return registry.handle("searcher", r, 0.0)

        us = {
            "search_scan": per_search_us(scan, searches),
            "search_index": per_search_us(indexed, searches),
            "search_request": per_search_us(whole, searches),
        }
        for subject, value in us.items():
            base = ("search_scan", name) if subject == "search_index" else None
            figures[subject, name] = Result(
                subject, name, value, "µs", baseline=base, lower_is_better=True
            )
    return figures


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lobbies", type=int, default=10_000)
    parser.add_argument("--members", type=int, default=8)
    parser.add_argument("--searches", type=int, default=200, help="per query and repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--results-dir",
        default=None,
        help="where search.json goes [default: bench/results]",
    )
    args = parser.parse_args(argv)
    if args.lobbies < 1 or args.repeats < 1 or args.searches < 1:
        parser.error("--lobbies, --repeats and --searches must be at least 1")
    load_before = result_files.system_load()
    registry = build(args.lobbies, args.members)
    repeats = [one_repeat(registry, args.searches) for _ in range(args.repeats)]
    for name in QUERIES:
        cells = [
            f"{subject[7:]} " + ", ".join(f"{r[subject, name].value:,.1f}" for r in repeats)
            for subject in ("search_index", "search_scan", "search_request")
        ]
        print(f"{name:<24} " + "   ".join(cells) + " µs")
    argv_used = sys.argv[1:] if argv is None else list(argv)
    record, left_out = result_files.from_repeats(
        bench_id="search",
        label="S1",
        title=f"S1: lobby search in process, {args.lobbies:,} full lobbies of {args.members}, "
        f"pages of {LIMIT}: the index against a scan of the listings",
        command=shlex.join(["python", "-m", "bench.search_bench", *argv_used]),
        own=[(s, name) for s in ("search_index", "search_request") for name in QUERIES],
        repeats=repeats,
        machine=result_files.machine_info(load_before, result_files.system_load()),
        settings=vars(args),
        labels={"search_scan": "a scan of every listing (same registry, same run)"},
    )
    for note in left_out:
        print(f"left out of the result file: {note}", file=sys.stderr)
    if record is not None:
        directory = args.results_dir or result_files.RESULTS_DIR
        print(f"wrote {record.write(Path(directory))}")


if __name__ == "__main__":
    main()
