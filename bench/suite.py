"""The registry of benchmarks that `python -m bench.run` knows.

To add one: write a function `(settings: Settings) -> list[Result]` that runs its sides with
`bench.harness.Child` (each side in its own process) or `CliProcess` (a CLI such as
echo-server), raises `Skip` when it cannot run here and `BenchError` when it fails, and gives
every Result

- a `baseline=(name, metric)` of a raw figure (or `raw=True` if it is one; a figure with
  neither has no raw counterpart, like B4's server CPU);
- optionally a `target`: `target=(">=", 0.6, "ratio")` is at least 0.6 x its
  baseline of the same run, `target=("<=", 20)` at most 20 in the figure's own unit (see
  `harness.Target`); the report marks it met or missed.

Then register it below with the baselines it compares to in `needs` (the runner then measures
those in the same run even under `--only`).
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from bench import (
    baselines,
    channels_bench,
    duologue_bench,
    loss,
    peers,
    scale,
    topics_bench,
    transport_bench,
)
from bench.harness import Result, Settings


@attrs.frozen
class Benchmark:
    func: Callable[[Settings], list[Result]]
    #: names of the benchmarks whose figures this one's ratios are computed against
    needs: tuple[str, ...] = ()
    #: one line for `--help` / `--list`, and the title in bench/results/<name>.json
    about: str = ""
    #: its name in the docs (B1, B2, ...), "" for none
    label: str = ""

    def __call__(self, settings: Settings) -> list[Result]:
        return self.func(settings)


_ECHO = ("raw_echo",)
_ONEWAY = ("raw_oneway",)

#: Run in this order: the baselines first, so a failure later still leaves them reported.
BENCHMARKS: dict[str, Benchmark] = {
    "raw_echo": Benchmark(baselines.raw_echo, (), "raw trio UDP echo round trips, 64 B"),
    "raw_oneway": Benchmark(
        baselines.raw_oneway, (), "raw trio UDP one-way datagrams, 64 / 1408 / 8192 B"
    ),
    "quic_echo": Benchmark(peers.quic_echo, _ECHO, "aioquic stream echo round trips, 64 B"),
    "quic_oneway": Benchmark(peers.quic_oneway, _ONEWAY, "aioquic one-way 64 B stream writes"),
    "enet_echo": Benchmark(peers.enet_echo, _ECHO, "pyenet reliable echo round trips, 64 B"),
    "enet_oneway": Benchmark(peers.enet_oneway, _ONEWAY, "pyenet one-way reliable 64 B"),
    "transport_oneway": Benchmark(
        transport_bench.transport_oneway,
        _ONEWAY,
        "B2: echo transport one-way, 64 B / 1 KiB / 16 KiB, and 16 KiB at mtu=8192",
        "B2",
    ),
    "transport_echo": Benchmark(
        transport_bench.transport_echo, _ECHO, "echo transport echo round trips, 64 B"
    ),
    "duologue_echo": Benchmark(
        duologue_bench.duologue_echo,
        _ECHO,
        "B1: echo-server duologue round trips, 64 B (lean client, then echo-client)",
        "B1",
    ),
    # Its baselines (bulk idle, the bare transport pair) are measured in its own run.
    "channels": Benchmark(
        channels_bench.channels,
        (),
        "C1/C2: logical channels: control p99 with bulk saturated vs idle (0 / 5 % loss); "
        "one channel's throughput vs the bare transport pair",
        "C1/C2",
    ),
    # Its baseline is its own 0 % level, measured first in the same run: needs nothing else.
    "loss": Benchmark(
        loss.loss,
        (),
        "B3: echo transport goodput, 1 KiB, at 0 / 5 / 20 % loss (netns + nft)",
        "B3",
    ),
    # Its raw baseline (the same datagrams to the same 1,000 sockets) is measured inside it.
    "topics": Benchmark(
        topics_bench.topics,
        (),
        "T1/T2: echo-topics fan-out to 1,000 subscribers vs raw sendto; publish-to-receive p99",
        "T1/T2",
    ),
    # Last: the longest (N = 100, 500, 1000 for 30 s each), and it has no raw baseline.
    "scale": Benchmark(
        scale.scale,
        (),
        "B4: N echo-clients (once a second) on one echo-server: handshakes/s, CPU, RSS, p99",
        "B4",
    ),
}
