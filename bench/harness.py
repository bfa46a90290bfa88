"""Shared pieces of the benchmark suite: records, percentiles, child processes, reports.

Every side of every benchmark runs in its own process (multiprocessing "spawn", so a child
starts from a clean interpreter and inherits no trio or asyncio state from the parent). The
parent only orchestrates: it starts the children, waits for them to say "ready", and collects
their results together with the CPU time and peak RSS each one used.

A report prints every figure next to its ratio to the raw trio UDP baseline measured in the
same run (docs/architecture.md, Performance rules: absolute figures drift run to run, ratios
are what compare).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import multiprocessing as mp
import os
import platform
import queue
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Self

import attrs

RESULTS_DIR = Path(__file__).resolve().parent / "results"

#: Socket buffers for every baseline and peer: large, so that a burst is absorbed by the kernel
#: instead of being dropped, and the baselines are not handicapped against the transport
#: (TransportConfig also asks for 4 MiB).
SOCKET_BUFFER = 4 * 1024 * 1024


class BenchError(Exception):
    """A benchmark could not produce a figure (a child failed, hung, or lost data)."""


class Skip(Exception):
    """A benchmark cannot run here (a peer package or an API is missing); not a failure."""


@attrs.frozen
class Target:
    """A goal set for one figure: `figure op threshold`.

    `of="ratio"` checks the figure's ratio to its raw baseline of the same run (`0.6` = 0.6 x
    raw), `of="value"` the figure itself in its own unit. A Result accepts the plain tuple too:
    `Result(..., target=(">=", 0.6, "ratio"))`, `Result(..., target=("<=", 20, "value"))`.
    """

    op: Literal[">=", "<="]
    threshold: float
    of: Literal["value", "ratio"] = "value"
    #: how the goal was put, when the report's unit differs (e.g. "600 MB" for a MiB figure)
    note: str = ""

    def __attrs_post_init__(self) -> None:
        if self.op not in (">=", "<="):
            raise ValueError(f"target op must be '>=' or '<=', not {self.op!r}")
        if self.of not in ("value", "ratio"):
            raise ValueError(f"a target is on the 'value' or the 'ratio', not {self.of!r}")

    def met(self, value: float, ratio: float | None) -> bool | None:
        """True / False; None when it is on the ratio and this run has no baseline for it."""
        subject = value if self.of == "value" else ratio
        if subject is None or math.isnan(subject):
            return None
        return subject >= self.threshold if self.op == ">=" else subject <= self.threshold

    def describe(self, unit: str, baseline: str = "raw") -> str:
        """'>= 0.60 x raw', '<= 20.00 ms', '>= 200,000 msg/s' (plus the note, if any)."""
        if self.of == "ratio":
            text = f"{self.op} {self.threshold:.2f} x {baseline}"
        else:
            text = f"{self.op} {format_figure(self.threshold, unit)}"
        return f"{text} ({self.note})" if self.note else text


TargetSpec = Target | tuple[Any, ...] | None


def as_target(spec: TargetSpec) -> Target | None:
    """Target, None, or a tuple of Target's fields (`(">=", 0.6, "ratio")`)."""
    if spec is None or isinstance(spec, Target):
        return spec
    return Target(*spec)


@attrs.frozen
class Result:
    """One figure. `baseline` names the (name, metric) of the raw figure it is compared to."""

    name: str
    metric: str
    value: float
    unit: str
    extra: dict[str, Any] = attrs.field(factory=dict)
    baseline: tuple[str, str] | None = None
    #: True when a smaller value is better (latency): the ratio is still value / baseline,
    #: but the report says so.
    lower_is_better: bool = False
    #: the goal for this figure, shown as met / missed in the report (see Target)
    target: Target | None = attrs.field(default=None, converter=as_target)
    #: True for the raw trio UDP figures themselves (shown as "baseline"); a figure with
    #: neither `raw` nor a `baseline` has no raw counterpart (scale: CPU, RSS, handshakes/s)
    raw: bool = False


@attrs.frozen
class Settings:
    """What the runner passes to every benchmark."""

    duration: float
    quick: bool
    #: bound on one child's life beyond `duration` (spawn start-up, connection set-up, drain)
    slack: float = 30.0
    #: CPUs the sides are pinned to, round robin in start order (see `pin`); () = unpinned
    pin: tuple[int, ...] = ()


# ------------------------------------------------------------------ statistics


def percentile(ordered: Sequence[float], q: float) -> float:
    """Exact nearest-rank percentile of already sorted samples (no interpolation).

    The smallest sample such that at least q % of the samples are <= it: with 1,000 samples
    p99.9 is the largest one, which is the honest answer for that few.
    """
    if not ordered:
        raise ValueError("percentile of no samples")
    if not 0 < q <= 100:
        raise ValueError(f"percentile {q} outside (0, 100]")
    # The tolerance keeps float noise (99.9 / 100 * 1000 = 999.0000000000001) from moving
    # the rank up by one.
    rank = math.ceil(q / 100 * len(ordered) - 1e-9)
    return ordered[max(rank, 1) - 1]


def latency_summary(samples_ns: list[int]) -> dict[str, float]:
    """p50 / p99 / p99.9 / max of round-trip samples in nanoseconds, as microseconds."""
    ordered = sorted(samples_ns)
    return {
        "p50_us": percentile(ordered, 50) / 1000,
        "p99_us": percentile(ordered, 99) / 1000,
        "p99.9_us": percentile(ordered, 99.9) / 1000,
        "max_us": ordered[-1] / 1000,
        "samples": float(len(ordered)),
    }


def warmup_seconds(duration: float) -> float:
    # Long enough for caches and the scheduler to settle, short enough for a quick run.
    return min(0.5, duration * 0.1)


class RoundTrips:
    """The timed loop of every echo benchmark: a warm-up, then `duration` seconds measured.

        rounds = RoundTrips(ctl, duration)
        for sequence in rounds:
            ...  # one round trip, its reply checked
        summary = rounds.summary()

    Each step is one round trip, timed from when the loop hands out its sequence number (0, 1,
    ... across both phases) until the body is done and asks for the next. `ctl.begin()` (and
    `on_begin`, e.g. to sample a server's CPU) marks where the measured part starts.
    """

    def __init__(
        self, ctl: Control, duration: float, on_begin: Callable[[], None] | None = None
    ) -> None:
        self.ctl = ctl
        self.duration = duration
        self.on_begin = on_begin
        self.samples: list[int] = []
        self.count = 0  # round trips in the measured part
        self.elapsed = 0.0  # its length in seconds
        self.total = 0  # round trips in all, warm-up included

    def __iter__(self) -> Iterator[int]:
        clock = time.perf_counter_ns
        samples = self.samples
        sequence = 0
        for phase, keep in ((warmup_seconds(self.duration), False), (self.duration, True)):
            if keep:
                self.ctl.begin()
                if self.on_begin is not None:
                    self.on_begin()
            started = clock()
            end = started + int(phase * 1e9)
            count = 0
            while (start := clock()) < end:
                yield sequence
                if keep:
                    samples.append(clock() - start)
                sequence += 1
                count += 1
            self.total = sequence
            self.count = count
            self.elapsed = (clock() - started) / 1e9

    def summary(self) -> dict[str, Any]:
        """Latency percentiles, round trips/s and round trips of the measured part."""
        summary: dict[str, Any] = latency_summary(self.samples)
        summary["round_trips_per_s"] = self.count / self.elapsed
        summary["round_trips"] = self.count
        return summary


def round_trip_results(
    name: str,
    summary: dict[str, Any],
    baseline: str | None,
    extra: dict[str, Any],
    targets: Mapping[str, TargetSpec] | None = None,
) -> list[Result]:
    """The four figures every echo benchmark reports, compared to `baseline`'s same metrics.

    `baseline=None` makes them raw figures themselves; `targets` maps a metric
    ("round trips/s", "p50", "p99", "p99.9") to its goal.
    """
    targets = targets or {}

    def base(metric: str) -> tuple[str, str] | None:
        return None if baseline is None else (baseline, metric)

    results = [
        Result(
            name,
            "round trips/s",
            summary["round_trips_per_s"],
            "RT/s",
            extra,
            base("round trips/s"),
            target=targets.get("round trips/s"),
            raw=baseline is None,
        )
    ]
    for key, metric in (("p50_us", "p50"), ("p99_us", "p99"), ("p99.9_us", "p99.9")):
        results.append(
            Result(
                name,
                metric,
                summary[key],
                "µs",
                {},
                base(metric),
                lower_is_better=True,
                target=targets.get(metric),
                raw=baseline is None,
            )
        )
    return results


# ------------------------------------------------------------------ sockets


def free_udp_port() -> int:
    """A port that was free a moment ago, for sides that must know each other's port up front.

    Racy by nature; only used where a side cannot bind port 0 and report it (both transport
    echo sides need the other's port before either starts).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


#: SO_RCVBUFFORCE / SO_SNDBUFFORCE (Linux socket(7)): Python's socket module does not name
#: them, so a `getattr(socket, ...)` never found them and the buffers were never forced
_FORCE_OPTIONS = {
    socket.SO_RCVBUF: getattr(socket, "SO_RCVBUFFORCE", 33 if sys.platform == "linux" else None),
    socket.SO_SNDBUF: getattr(socket, "SO_SNDBUFFORCE", 32 if sys.platform == "linux" else None),
}


def set_buffers(sock: socket.socket) -> dict[str, int]:
    """Ask for SOCKET_BUFFER both ways; as root force past net.core.[rw]mem_max.

    Returns what the kernel granted (it reports double the request: its bookkeeping share).
    """
    for plain, force in _FORCE_OPTIONS.items():
        try:
            if force is None:
                raise PermissionError
            sock.setsockopt(socket.SOL_SOCKET, force, SOCKET_BUFFER)
        except PermissionError:
            sock.setsockopt(socket.SOL_SOCKET, plain, SOCKET_BUFFER)
    return {
        "rcvbuf": sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF),
        "sndbuf": sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF),
    }


def kernel_drops(sock: socket.socket) -> int | None:
    """The datagrams the kernel dropped on arrival at `sock` (its receive queue was full), from
    the `drops` column of /proc/net/udp (udp6 for IPv6), found by the socket's inode; None where
    the kernel does not say (not Linux). What a receiver counts is what it read: this is the
    rest of what reached it."""
    inode = str(os.fstat(sock.fileno()).st_ino)
    table = "/proc/net/udp6" if sock.family == socket.AF_INET6 else "/proc/net/udp"
    try:
        with open(table) as rows:
            next(rows, None)  # the header
            for row in rows:
                fields = row.split()
                if len(fields) > 12 and fields[9] == inode:
                    return int(fields[12])
    except OSError:
        return None
    return None


# ------------------------------------------------------------------ child processes


@attrs.frozen
class Usage:
    """What one child spent: CPU seconds while running the function, wall seconds, peak RSS."""

    cpu_s: float
    wall_s: float
    peak_rss_mib: float

    @property
    def cpu_percent(self) -> float:
        return 100 * self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0


def _cpu_now() -> tuple[float, float]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime, time.perf_counter()


class Control:
    """Handed to a child function as its first argument: how it talks to the parent."""

    def __init__(self, channel: Any) -> None:
        self._channel = channel
        self.began: tuple[float, float] | None = None
        self.ended: tuple[float, float] | None = None

    def begin(self) -> None:
        """The measured part starts now (first datagram, first round trip): CPU counts from here.

        Without it a receiver's CPU % would be diluted by the time it waited for the sender's
        process to start, which is most of a quick run.
        """
        if self.began is None:
            self.began = _cpu_now()

    def end(self) -> None:
        """The measured part is over; what follows (drain, linger, close) is not counted."""
        if self.ended is None:
            self.ended = _cpu_now()

    def ready(self, info: Any = None) -> None:
        """Tell the parent this side is listening (and, e.g., on which port)."""
        self._channel.put(("ready", info))


def _peak_rss_mib() -> float:
    # VmHWM is the resident high-water mark of this process; ru_maxrss says the same in KiB
    # on Linux. Prefer /proc and fall back where it is absent.
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


#: Set through `pin`: children are pinned, in the order they start, to the CPUs listed here,
#: round robin (so the two sides of a benchmark get different cores).
PIN_CPUS: list[int] = []
_next_pin = 0


def pin(cpus: Sequence[int]) -> None:
    """Pin the children started from now on to `cpus`, round robin; () unpins.

    Why: on this 2-core machine a ping-pong between two processes on the SAME core runs about
    twice the round trips of one across cores (no cross-core wake-up), and the scheduler picks
    either from run to run, so unpinned echo figures are bimodal (~24,000 vs ~12,000 RT/s) and
    a ratio could compare one mode with the other. Pinning the first side (server, receiver)
    to one core and the second (client, sender) to another makes every run the cross-core
    case, which is also the one a real client and server are in.
    """
    global _next_pin
    PIN_CPUS[:] = list(cpus)
    _next_pin = 0


def next_cpu() -> int | None:
    """The CPU for the next side to start (round robin over `pin`'s list), None if unpinned."""
    global _next_pin
    if not PIN_CPUS:
        return None
    cpu = PIN_CPUS[_next_pin % len(PIN_CPUS)]
    _next_pin += 1
    return cpu


def _child_main(
    func: Callable[..., Any], args: tuple[Any, ...], channel: Any, cpu: int | None
) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    # CPU is measured around the function only: the spawn start-up and imports are the same
    # for every benchmark and would blur short runs.
    control = Control(channel)
    before = _cpu_now()
    try:
        value = func(control, *args)
    except BaseException:  # anything, KeyboardInterrupt too: the parent must hear of it
        channel.put(("error", traceback.format_exc()))
        return
    after = control.ended or _cpu_now()
    before = control.began or before
    usage = Usage(after[0] - before[0], after[1] - before[1], _peak_rss_mib())
    channel.put(("done", value, usage))


class Child:
    """One side of a benchmark in its own spawned process."""

    def __init__(self, name: str, func: Callable[..., Any], *args: Any) -> None:
        context = mp.get_context("spawn")
        self.name = name
        self._channel: Any = context.Queue()
        cpu = next_cpu()
        self.cpu = cpu
        self._process = context.Process(
            target=_child_main, args=(func, args, self._channel, cpu), name=name, daemon=True
        )
        self.usage: Usage | None = None

    def start(self) -> Child:
        self._process.start()
        return self

    def _next(self, timeout: float) -> tuple[Any, ...]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                message: tuple[Any, ...] = self._channel.get(timeout=0.2)
            except queue.Empty:
                if not self._process.is_alive():
                    # It may have put its last word just before exiting: look once more.
                    try:
                        message = self._channel.get(timeout=0.5)
                    except queue.Empty:
                        raise BenchError(
                            f"{self.name}: child exited ({self._process.exitcode}) silently"
                        ) from None
                elif time.monotonic() >= deadline:
                    raise BenchError(f"{self.name}: no answer within {timeout:.0f} s") from None
                else:
                    continue
            if message[0] == "error":
                raise BenchError(f"{self.name} failed:\n{message[1]}")
            return message

    def wait_ready(self, timeout: float = 30.0) -> Any:
        message = self._next(timeout)
        if message[0] != "ready":
            raise BenchError(f"{self.name}: expected 'ready', got {message[0]!r}")
        return message[1]

    def result(self, timeout: float) -> Any:
        message = self._next(timeout)
        if message[0] == "ready":  # nobody waited for it
            message = self._next(timeout)
        if message[0] != "done":
            raise BenchError(f"{self.name}: expected a result, got {message[0]!r}")
        self.usage = message[2]
        self._process.join(5)
        return message[1]

    def kill(self) -> None:
        if self._process.is_alive():
            self._process.kill()
            self._process.join(5)

    def __enter__(self) -> Child:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        # Whatever happened, no child outlives its benchmark.
        self.kill()


# ------------------------------------------------------------------ command-line sides


def cpu_seconds_of(pid: int) -> float:
    """User + system CPU seconds a process has used so far (/proc/PID/stat utime + stime)."""
    with open(f"/proc/{pid}/stat") as stat:
        # The command name (field 2) may hold spaces; the fields after its ")" do not.
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def memory_mib_of(pid: int, field: str = "VmRSS") -> float:
    """A /proc/PID/status memory field in MiB: VmRSS (now) or VmHWM (peak)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    raise BenchError(f"/proc/{pid}/status has no {field}")


class CliProcess:
    """A command-line program as one side of a benchmark (echo-server as users run it).

    Started with `subprocess`, pinned like a `Child` (the next CPU of `pin`, or `cpu=`), its
    stderr read by a thread: the program is ready when a JSON log line with
    `"event": ready_event` appears (`--log-format json`), and the lines are kept for errors
    and for the counters a server logs when it stops. Its CPU and memory are read from /proc,
    so a measuring side can sample them around exactly its measured part.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        ready_event: str | None = "listening",
        cpu: int | Literal["next"] | None = "next",
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.ready_event = ready_event
        self.cpu = next_cpu() if cpu == "next" else cpu
        self.lines: deque[str] = deque(maxlen=10_000)
        self._new_line = threading.Condition()
        self._ended = False
        self._ready = threading.Event()
        self._seen_ready = False
        self._process: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None

    @property
    def pid(self) -> int:
        assert self._process is not None, "not started"
        return self._process.pid

    def start(self) -> Self:
        if self._process is not None:
            raise RuntimeError(f"{self.name} was started already")
        self._process = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        if self.cpu is not None:
            # Right after the fork: before the program has imported anything, so all of its
            # measured work runs on this CPU.
            os.sched_setaffinity(self._process.pid, {self.cpu})
        self._reader = threading.Thread(target=self._read, name=f"{self.name} log", daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        assert self._process is not None and self._process.stdout is not None
        for line in self._process.stdout:
            with self._new_line:
                self.lines.append(line)
                self._new_line.notify_all()
            if not self._seen_ready and self.ready_event is not None:
                if f'"{self.ready_event}"' in line and self.event(line) == self.ready_event:
                    self._seen_ready = True
                    self._ready.set()
        # End of output: the program exited; whoever waits for a line must hear of it.
        with self._new_line:
            self._ended = True
            self._new_line.notify_all()
        self._ready.set()

    @staticmethod
    def event(line: str) -> str | None:
        try:
            record = json.loads(line)
        except ValueError:
            return None
        return record.get("event") if isinstance(record, dict) else None

    def records(self, event: str) -> list[dict[str, Any]]:
        """Every JSON log record so far with this event name."""
        found = []
        for line in list(self.lines):
            if f'"{event}"' in line and self.event(line) == event:
                found.append(json.loads(line))
        return found

    def wait_for_record(
        self, event: str, match: Callable[[dict[str, Any]], bool], timeout: float
    ) -> dict[str, Any]:
        """The first JSON log record of `event` that `match` accepts, waiting for it to come."""
        deadline = time.monotonic() + timeout
        with self._new_line:
            while True:
                for record in self.records(event):
                    if match(record):
                        return record
                remaining = deadline - time.monotonic()
                if self._ended or remaining <= 0:
                    raise BenchError(
                        f"{self.name}: no matching {event!r} in its log "
                        f"({'it exited' if self._ended else f'{timeout:.0f} s'}):\n{self.tail()}"
                    )
                self._new_line.wait(remaining)

    def wait_ready(self, timeout: float = 30.0) -> None:
        if not self._ready.wait(timeout):
            raise BenchError(f"{self.name}: not ready within {timeout:.0f} s")
        if not self._seen_ready:
            raise BenchError(f"{self.name}: exited before it was ready:\n{self.tail()}")

    def tail(self, lines: int = 20) -> str:
        return "".join(list(self.lines)[-lines:])

    def cpu_seconds(self) -> float:
        return cpu_seconds_of(self.pid)

    def rss_mib(self) -> float:
        return memory_mib_of(self.pid, "VmRSS")

    def peak_rss_mib(self) -> float:
        return memory_mib_of(self.pid, "VmHWM")

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM (a server's graceful stop), wait, and return the exit status."""
        assert self._process is not None
        if self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)
        try:
            code = self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise BenchError(f"{self.name}: still running {timeout:.0f} s after SIGTERM") from None
        if self._reader is not None:
            self._reader.join(5)
        return code

    def kill(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait(5)

    def __enter__(self) -> Self:
        # `with start_server() as server:` gets one that is already running: start it only
        # once (a second process on the same ports would fail, and orphan the first).
        return self if self._process is not None else self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.kill()


def usage_extra(**children: Child) -> dict[str, Any]:
    """CPU % of one core and peak RSS per side, for a Result's extra dict."""
    extra: dict[str, Any] = {}
    for role, child in children.items():
        if child.usage is not None:
            extra[f"{role}_cpu_pct"] = round(child.usage.cpu_percent, 1)
            extra[f"{role}_cpu_s"] = round(child.usage.cpu_s, 3)
            extra[f"{role}_peak_rss_mib"] = round(child.usage.peak_rss_mib, 1)
    return extra


# ------------------------------------------------------------------ reports


def system_load() -> dict[str, float]:
    """Load average and CPU pressure (PSI "some", % of time a task waited for a CPU).

    Benchmarks on a shared 2-core machine are only as good as its idleness: recorded before
    and after a run so that a report measured next to, say, a test suite says so.
    """
    load: dict[str, float] = {}
    try:
        with open("/proc/loadavg") as loadavg:
            load["loadavg_1m"] = float(loadavg.read().split()[0])
    except OSError:
        pass
    try:
        with open("/proc/pressure/cpu") as pressure:
            for line in pressure:
                if line.startswith("some"):
                    fields = dict(field.split("=") for field in line.split()[1:])
                    load["cpu_pressure_avg10_pct"] = float(fields["avg10"])
                    load["cpu_pressure_avg60_pct"] = float(fields["avg60"])
    except (OSError, KeyError, ValueError):
        pass
    return load


#: Above these the machine was not idle enough for figures to be trusted (see system_load).
BUSY_LOADAVG = 0.7
BUSY_PRESSURE_PCT = 5.0


def busy_warning(loads: dict[str, dict[str, float]]) -> str | None:
    busy = [
        f"{when}: load {load.get('loadavg_1m', 0):.2f}, "
        f"CPU pressure {load.get('cpu_pressure_avg10_pct', 0):.0f}%"
        for when, load in loads.items()
        # After the run the load average counts our own processes: only pressure tells then.
        if (when == "before" and load.get("loadavg_1m", 0) > BUSY_LOADAVG)
        or load.get("cpu_pressure_avg10_pct", 0) > BUSY_PRESSURE_PCT
    ]
    if not busy:
        return None
    return "**Warning: other work was running** (" + "; ".join(busy) + "); figures are low."


def machine_info() -> dict[str, Any]:
    from bench.results import cpu_model

    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "kernel": platform.release(),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


def ratio(result: Result, by_key: dict[tuple[str, str], Result]) -> float | None:
    if result.baseline is None:
        return None
    base = by_key.get(result.baseline)
    if base is None or base.value == 0:
        return None
    return result.value / base.value


def target_met(result: Result, by_key: dict[tuple[str, str], Result]) -> bool | None:
    """Whether `result` meets its target in this run; None without a target (or a baseline)."""
    if result.target is None:
        return None
    return result.target.met(result.value, ratio(result, by_key))


def format_figure(value: float, unit: str) -> str:
    if unit == "µs":
        return f"{value:,.0f} µs"
    if unit in ("MB/s", "%"):
        return f"{value:,.1f} {unit}"
    if unit == "MiB":
        return f"{value:,.1f} MiB"
    if unit == "ms":
        return f"{value:,.2f} ms" if value < 100 else f"{value:,.0f} ms"
    return f"{value:,.0f} {unit}"


def _vs_raw(result: Result, r: float | None) -> str:
    if result.raw:
        return "baseline"
    if result.baseline is None:
        return "—"  # no raw trio UDP counterpart (server CPU, RSS, handshakes/s)
    return "n/a" if r is None else f"{r:.2f} x"


def _target_cells(result: Result, by_key: dict[tuple[str, str], Result]) -> tuple[str, str]:
    if result.target is None:
        return "", ""
    met = target_met(result, by_key)
    verdict = "n/a (no baseline)" if met is None else ("met" if met else "**missed**")
    baseline = "raw"
    if result.baseline is not None and not result.baseline[0].startswith("raw_"):
        baseline = result.baseline[0]  # a ratio to another row of the run (loss_0pct)
    return result.target.describe(result.unit, baseline), verdict


def _side_usage(extra: dict[str, Any]) -> str:
    parts = []
    for role in ("client", "server", "sender", "receiver"):
        if f"{role}_cpu_pct" in extra:
            parts.append(
                f"{role} {extra[f'{role}_cpu_pct']:.0f}% / {extra[f'{role}_peak_rss_mib']:.0f} MiB"
            )
    return ", ".join(parts)


def markdown(
    results: list[Result],
    skipped: dict[str, str],
    failed: dict[str, str],
    machine: dict[str, Any],
    settings: Settings,
) -> str:
    by_key = {(r.name, r.metric): r for r in results}
    lines = [
        f"# Benchmarks {machine['date']}",
        "",
    ]
    warning = busy_warning(machine.get("load", {}))
    if warning:
        lines += [warning, ""]
    lines += [
        f"{machine['cpu']}, {machine['cores']} cores, {machine['implementation']} "
        f"{machine['python']}, Linux {machine['kernel']}; {settings.duration:g} s per "
        f"measurement{' (quick)' if settings.quick else ''}; loopback; "
        + (
            f"the two sides pinned to CPUs {', '.join(map(str, settings.pin))}."
            if settings.pin
            else "sides not pinned to CPUs."
        ),
        "",
        "Ratios are to the raw trio UDP baseline of this same run (`x raw`); for latency a "
        "ratio above 1 is slower. Message rates compare to raw 64-byte datagrams/s (one "
        "datagram per message), MB/s to raw datagrams of the MTU used (1408 B, Aeron's "
        "default; 8192 B for `mtu8192`); `—` marks a figure with no raw counterpart (server "
        "CPU, RSS, handshakes/s). A ratio that names a row (`x loss_0pct`) is to that row of "
        "this same run. Targets are the project's; a ratio target is checked against this run's "
        "baseline.",
        "",
        "| benchmark | metric | figure | vs raw | target | met | CPU (% of a core) / peak RSS |",
        "|---|---|---|---|---|---|---|",
    ]
    verdicts: list[bool | None] = []
    for result in results:
        r = ratio(result, by_key)
        target, verdict = _target_cells(result, by_key)
        if result.target is not None:
            verdicts.append(target_met(result, by_key))
        shown = _vs_raw(result, r)
        if r is not None and result.baseline and not result.baseline[0].startswith("raw_"):
            shown += f" {result.baseline[0]}"
        usage = _side_usage(result.extra)
        if "summary" in result.extra:
            # What explains the figure (e.g. the loss measured and the NAKs it cost).
            usage = "; ".join(part for part in (usage, result.extra["summary"]) if part)
        lines.append(
            f"| {result.name} | {result.metric} | {format_figure(result.value, result.unit)} "
            f"| {shown} | {target} | {verdict} | {usage} |"
        )
    if verdicts:
        lines += [
            "",
            f"Targets: {verdicts.count(True)} met, {verdicts.count(False)} missed"
            + (f", {verdicts.count(None)} without a baseline" if None in verdicts else "")
            + ".",
        ]
    if skipped:
        lines += ["", "Skipped:", ""]
        lines += [f"- {name}: {reason}" for name, reason in skipped.items()]
    if failed:
        lines += ["", "Failed:", ""]
        lines += [
            f"- {name}: {reason.strip().splitlines()[-1] if reason.strip() else '?'}"
            for name, reason in failed.items()
        ]
    return "\n".join(lines) + "\n"


def write_reports(
    results: list[Result],
    skipped: dict[str, str],
    failed: dict[str, str],
    settings: Settings,
    directory: Path = RESULTS_DIR,
    load_before: dict[str, float] | None = None,
) -> tuple[Path, Path, str]:
    """Write `runs/<timestamp>.json` and `latest.md` under `directory`; return both and the
    table. (The per-benchmark result files beside them are bench/results.py's.)"""
    directory.mkdir(parents=True, exist_ok=True)
    machine = machine_info()
    # "before" is the idle machine (or not); "after" includes the run's own last minute, so
    # only its pressure figure (a task of ours waiting means a CPU was taken) is telling.
    machine["load"] = {"before": load_before or {}, "after": system_load()}
    by_key = {(r.name, r.metric): r for r in results}
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    (directory / "runs").mkdir(exist_ok=True)
    json_path = directory / "runs" / f"{stamp}.json"
    serial = 1
    while json_path.exists():  # two repeats of a quick run within one second
        serial += 1
        json_path = directory / "runs" / f"{stamp}-{serial}.json"
    document = {
        "machine": machine,
        "settings": attrs.asdict(settings),
        "argv": sys.argv[1:],
        "results": [
            {
                **attrs.asdict(r),
                "ratio_to_raw": ratio(r, by_key),
                "target_met": target_met(r, by_key),
            }
            for r in results
        ],
        "skipped": skipped,
        "failed": failed,
    }
    json_path.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n")
    table = markdown(results, skipped, failed, machine, settings)
    md_path = directory / "latest.md"
    md_path.write_text(table)
    return json_path, md_path, table
