"""The registry of benchmarks that `python -m bench.run` knows.

To add one: write a function `(settings: Settings) -> list[Result]` that runs its sides with
`bench.harness.Child` (each side in its own process), raises `Skip` when it cannot run here and
`BenchError` when it fails, gives every Result a `baseline=(name, metric)` of a raw figure, and
register it below with the baselines it compares to in `needs` (the runner then measures those
in the same run even under `--only`).
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from bench import baselines, loss, peers, transport_bench
from bench.harness import Result, Settings


@attrs.frozen
class Benchmark:
    func: Callable[[Settings], list[Result]]
    #: names of the benchmarks whose figures this one's ratios are computed against
    needs: tuple[str, ...] = ()
    #: one line for `--help` / `--list`
    about: str = ""

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
        transport_bench.transport_oneway, _ONEWAY, "echo transport one-way, 64 B / 1 KiB / 16 KiB"
    ),
    "transport_echo": Benchmark(
        transport_bench.transport_echo, _ECHO, "echo transport echo round trips, 64 B"
    ),
    # Its baseline is its own 0 % level, measured first in the same run: needs nothing else.
    "loss": Benchmark(
        loss.loss, (), "B3: echo transport goodput, 1 KiB, at 0 / 5 / 20 % loss (netns + nft)"
    ),
}
