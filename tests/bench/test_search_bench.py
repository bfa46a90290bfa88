"""S1 (bench.search_bench): a short run writes a valid result file whose index figures are
compared to the scan of the same repeat, and a page the index answers differently from the
scan stops the run."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import results, search_bench
from echo.lobby.protocol import LobbyListing, StringEquals


def test_a_short_run_writes_the_index_against_the_scan(tmp_path: Path) -> None:
    search_bench.main(
        ["--lobbies", "40", "--searches", "3", "--repeats", "2", "--results-dir", str(tmp_path)]
    )
    record = results.load(tmp_path / "search.json")
    assert record.id == "search" and record.repeats == 2
    by_key = {(m.subject, m.name): m for m in record.metrics}
    for name in search_bench.QUERIES:
        index = by_key["search_index", name]
        assert index.baseline is not None and index.baseline.subject == "search_scan"
        assert len(index.values) == len(index.baseline.values) == 2
        assert all(v > 0 for v in index.values + index.baseline.values)
        assert by_key["search_request", name].baseline is None


def test_the_registry_is_built_as_described() -> None:
    registry = search_bench.build(8, 3)
    listings = registry.listings()
    assert [x.lobby_id for x in listings] == list(range(1, 9))
    assert all(x.member_count == x.max_members == 3 for x in listings)
    assert search_bench.scan_page(listings, (StringEquals("mode", "duel"),)) == [2, 6]


def test_a_wrong_page_is_not_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    def wrong(listings: list[LobbyListing], filters: object) -> list[int]:
        return [x.lobby_id for x in listings][:1]

    monkeypatch.setattr(search_bench, "scan_page", wrong)
    with pytest.raises(AssertionError):
        search_bench.one_repeat(search_bench.build(10, 2), 1)
