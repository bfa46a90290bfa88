"""M1's network mode (bench.matchmaker_bench --net, bench.matchmaker_net): a smoke run over
real sockets and processes (one echo-lobby, two bot processes) matches every player and
writes its figures next to the in-process run's; and the figures are read as documented."""

from __future__ import annotations

import random
from pathlib import Path

from bench import matchmaker_bench, matchmaker_net, results


def test_a_smoke_run_over_udp_matches_every_player(tmp_path: Path) -> None:
    # A port range of its own (the smoke's server binds 2 x 72 duologue ports above it):
    # above the kernel's ephemeral ports (net.ipv4.ip_local_port_range, 32768-60999 here) and
    # the benchmarks' defaults, which may be running on this machine; tried again elsewhere if
    # something holds one of them all the same.
    for _attempt in range(3):
        port = random.randrange(61_000, 65_300, 2)
        matchmaker_bench.main(
            [
                *("--net", "--smoke", "--port", str(port), "--results-dir", str(tmp_path)),
                *("--work-dir", str(tmp_path / "runs")),
            ]
        )
        log = (tmp_path / "runs" / "m1-net-server.log").read_text()
        if "Address already in use" not in log:
            break
    record = results.load(tmp_path / "m1.json")
    by_key = {(m.subject, m.name): m for m in record.metrics}
    net = {name: by_key["matchmaker_net_40", name] for name in (*matchmaker_bench.UNITS, "matched")}
    assert net["matched"].values == (100.0,)
    for name in matchmaker_bench.UNITS:
        # Each against the in-process figure of the same repeat.
        baseline = net[name].baseline
        assert baseline is not None and baseline.subject == "matchmaker_40"
    assert all(net[name].values[0] > 0 for name in ("matches/s", "players/s", "queue p50"))
    assert net["queue p50"].values[0] <= net["queue p99"].values[0]
    assert by_key["matchmaker_net_40", "connects/s"].values[0] > 0
    (repeat,) = record.settings["net"]["repeats"]
    assert repeat["connected"] == repeat["queued"] == repeat["matched"] == 40
    assert repeat["wrong size"] == repeat["refused"] == repeat["left"] == 0
    # 20 duels of 2 and 20 squads of 4: exactly 10 + 5 matches.
    assert repeat["matches"] == 15
    assert 0 < repeat["wave s"] and repeat["all seated s"] > 0


class Flat(matchmaker_net.CpuSampler):
    """CPU samples given, not read from /proc."""

    def __init__(self, samples: list[tuple[float, float]]) -> None:
        self.samples = samples


def test_the_wave_ends_with_the_last_match_seated_by_the_last_reply() -> None:
    connected = [{"connected": 6, "failed": 0, "errors": {}, "t0": 0.0, "t1": 2.0}]
    # Players queue from t=10.0 (last reply 10.5); one duel seated at 10.4, one squad at
    # 10.6 (within the match interval after the last reply), one duel late at 20.0.
    seated = [[10.3, 1, 2], [10.4, 1, 2]] + [[10.6, 2, 4]] * 4 + [[20.0, 3, 2]] * 2
    queued = [
        {
            "queued": 8,
            "refused": 0,
            "left": 0,
            "errors": {},
            "t_first": 10.0,
            "t_queued": 10.5,
            "seated": seated,
            "waits": [100.0] * 6 + [9000.0] * 2,
        }
    ]
    sampler = Flat([(t / 10, t / 100) for t in range(300)])  # (half a core)
    got = matchmaker_net.summarize(connected, queued, sampler, players=8)
    assert got["matches"] == 3 and got["wrong size"] == 0
    assert abs(got["wave s"] - 0.6) < 1e-9
    assert abs(got["matches/s"] - 2 / 0.6) < 1e-9
    assert abs(got["players/s"] - 6 / 0.6) < 1e-9
    assert got["late"] == 2 and got["matched"] == 8
    assert abs(got["all seated s"] - 10.0) < 1e-9
    assert got["connects/s"] == 3.0
    # A match seated with a member missing is counted as the wrong size.
    queued[0]["seated"] = seated[:-1]
    assert matchmaker_net.summarize(connected, queued, sampler, players=8)["wrong size"] == 1
