"""The writer of a generated event log: the heap of pending lines written in time order,
the lobby part merged in, the bad-line mangler, and the counts every written line adds to.
"""


from __future__ import annotations

import heapq
import json
import random
import re
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any, Final

from echo.telemetry.schema import SCHEMA_VERSION
from echo.telemetry.truth import _US

UNKNOWN_EVENT: Final = "config_reloaded"  # stands in for an event a newer server might add




class _Writer:
    """Heap of pending lines, the output file, the bad-line mangler and the truth counters."""

    def __init__(
        self,
        path: str,
        rng: random.Random,
        bad_rate: float,
        lobby_lines: Iterator[tuple[int, str, str, str]] | None = None,
        lobby_rng: random.Random | None = None,
    ) -> None:
        self.rng = rng
        # Lobby lines come time-ordered from their own simulation and are merged in as the
        # echo lines are written; their bad copies use their own random stream, so the echo
        # part of the file is the same with or without lobbies.
        self._lobby = lobby_lines
        self._lobby_next = next(lobby_lines, None) if lobby_lines is not None else None
        self.lobby_rng = lobby_rng or rng
        self.bad_rate = bad_rate
        self.out = open(path, "w", encoding="utf-8", buffering=1 << 20)
        self.heap: list[tuple[int, int, str, str, str]] = []
        self.seq = 0
        self.lines = 0
        self.bad = 0
        self.unknown = 0
        self.by_type: Counter[str] = Counter()
        self.by_day: Counter[str] = Counter()
        self.per_minute: dict[int, list[int]] = {}
        self.first_us: int | None = None
        self.last_us = 0
        self.echo_last_us = 0
        self.lobby_lines = 0  # lines (bad copies too) of the lobby part: `events` excludes them
        self._sec = -1
        self._sec_prefix = ""
        self._day_of: dict[int, str] = {}

    def push(self, ts_us: int, server_id: str, event: str, tail: str) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (ts_us, self.seq, server_id, event, tail))

    def flush_until(self, ts_us: int) -> None:
        heap = self.heap
        while heap and heap[0][0] <= ts_us:
            self._write(*heapq.heappop(heap))

    def _ts(self, ts_us: int) -> str:
        sec, us = divmod(ts_us, _US)
        if sec != self._sec:
            self._sec = sec
            self._sec_prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec))
        return f"{self._sec_prefix}.{us:06d}Z"

    def _drain_lobby(self, ts_us: int) -> None:
        while self._lobby_next is not None and self._lobby_next[0] <= ts_us:
            before = self.lines
            self._emit(*self._lobby_next, self.lobby_rng)
            self.lobby_lines += self.lines - before
            assert self._lobby is not None
            self._lobby_next = next(self._lobby, None)

    def _write(self, ts_us: int, _seq: int, server_id: str, event: str, tail: str) -> None:
        self._drain_lobby(ts_us)
        self._emit(ts_us, server_id, event, tail, self.rng)
        self.echo_last_us = ts_us

    def _emit(self, ts_us: int, server_id: str, event: str, tail: str, rng: random.Random) -> None:
        line = (
            f'{{"ts":"{self._ts(ts_us)}","server_id":"{server_id}","event":"{event}",'
            f'"schema_version":{SCHEMA_VERSION}{tail}}}\n'
        )
        self.out.write(line)
        self.lines += 1
        if self.first_us is None:
            self.first_us = ts_us
        self.last_us = ts_us
        self.by_type[event] += 1
        if event == UNKNOWN_EVENT:
            self.unknown += 1
        day_n = ts_us // (86400 * _US)
        day = self._day_of.get(day_n)
        if day is None:
            day = self._day_of[day_n] = time.strftime("%Y-%m-%d", time.gmtime(day_n * 86400))
        self.by_day[day] += 1
        if rng.random() < self.bad_rate:
            self.out.write(_mangle(line[:-1], rng) + "\n")
            self.lines += 1
            self.bad += 1

    def count_minute(self, ts_us: int, series: int) -> None:
        counts = self.per_minute.get(ts_us // (60 * _US))
        if counts is None:
            counts = self.per_minute[ts_us // (60 * _US)] = [0, 0, 0, 0]
        counts[series] += 1

    def close(self) -> None:
        self.flush_until(2**63)
        self._drain_lobby(2**63)
        self.out.close()


_INT_FIELD = re.compile(
    r'"(duologue_id|client_session|port|sent|messages|lobby_id|members|bytes)":(-?\d+)'
)
_STR_FIELD = re.compile(r'"(source_ip|reason|address|server|state|member_id|code)":"[^"]*"')


def _mangle(line: str, rng: random.Random) -> str:
    """A copy of a good line that schema v1 rejects, in one of the ways real logs go bad."""
    kind = rng.randrange(8)
    if kind == 0:  # a crash mid-write, or two writers interleaving
        return line[: rng.randrange(1, len(line) - 1)]
    if kind == 1:
        return rng.choice(("GET / HTTP/1.1", "\x00\x00\x00", "not json at all", "[1, 2, 3]", "42"))
    if kind == 2:
        return line.replace('"schema_version":1', '"schema_version":"1"')
    if kind == 3:
        return re.sub(r'"server_id":"[^"]*",', "", line)
    if kind == 4:
        return line.replace('"schema_version":1', '"schema_version":2')
    if kind == 5:
        return line.replace("T", " ", 1)  # a timestamp that is not RFC 3339
    if kind == 6 and _INT_FIELD.search(line):
        return _INT_FIELD.sub(lambda m: f'"{m[1]}":"{m[2]}"', line, count=1)
    if kind == 7 and _STR_FIELD.search(line):
        return _STR_FIELD.sub(lambda m: f'"{m[1]}":12345', line, count=1)
    return line.replace('"event":', '"evnt":')  # missing event name


def _tail(fields: dict[str, Any]) -> str:
    return "".join(f',"{k}":{json.dumps(v)}' for k, v in fields.items())
