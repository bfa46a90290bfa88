"""A memory probe for servers under churn: ``ECHO_MEMDEBUG=DIR`` in a server's environment.

With the variable set, the server starts ``tracemalloc`` at start-up and, on every SIGUSR1,
writes ``DIR/memdebug-<pid>-<n>.json``: the live objects the cyclic collector tracks, counted
by type, and the allocation sites whose live size grew most since the previous dump (with the
counts' and sizes' differences). Two dumps N sessions apart say what grows with sessions
served, without stopping the server. Each dump also says what the transport's logs hold:
the live publications' and images' terms, mapped and resident (mincore(2): the pages the
kernel holds, which no Python-level count sees), and the images by state; and what the two
allocators under the objects hold: pymalloc's arenas and blocks, glibc's heap (mallinfo2), so
that RSS growth with no object growth can be placed. Off (and free) when
the variable is unset: tracemalloc costs a third of a server's throughput, it is for looking,
not for production.
"""

from __future__ import annotations

import ctypes
import gc
import json
import mmap
import os
import re
import signal
import sys
import tempfile
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

import trio

from echo.transport.core.appender import LogAppender
from echo.transport.core.image import PublicationImage
from echo.transport.core.logbuffer import TermBuffers

ENV = "ECHO_MEMDEBUG"
#: frames kept per allocation (tracemalloc's traceback limit); 0: no tracemalloc (type counts
#: only, which cost nothing between dumps)
FRAMES_ENV = "ECHO_MEMDEBUG_FRAMES"
FRAMES = 8
#: the allocation sites and types listed per dump
TOP = 40


def type_counts() -> Counter[str]:
    """Objects the cyclic collector tracks, by qualified type name (frozen ones included)."""
    counts: Counter[str] = Counter()
    for obj in gc.get_objects():
        kind = type(obj)
        counts[f"{kind.__module__}.{kind.__qualname__}"] += 1
    return counts


def resident_bytes(log: TermBuffers) -> int | None:
    """Bytes of a log's terms in memory now (mincore), 0 once it is closed; None off Linux."""
    if sys.platform != "linux":
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    total = 0
    for term in log.maps:
        if term.closed:
            return 0
        view = (ctypes.c_char * len(term)).from_buffer(term)
        try:
            vector = (ctypes.c_ubyte * (len(term) // mmap.PAGESIZE))()
            if libc.mincore(ctypes.c_void_p(ctypes.addressof(view)), len(term), vector):
                return None
            total += sum(v & 1 for v in vector) * mmap.PAGESIZE
        finally:
            del view  # an mmap cannot close while a ctypes view exports it
    return total


def _reachable(kinds: tuple[type, ...]) -> list[Any]:
    """Live objects of `kinds`, frozen ones included: a server freezes what it made at start-up
    (its all-clients channel among it) and `gc.get_objects` leaves the frozen out, so this
    walks every object reachable from the modules and from those the collector tracks."""
    found = []
    seen: set[int] = set()
    stack: list[Any] = [*sys.modules.values(), *gc.get_objects()]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, kinds):
            found.append(obj)
        stack.extend(o for o in gc.get_referents(obj) if gc.is_tracked(o))
    return found


def log_usage() -> dict[str, Any]:
    """The live logs by owner: how many, bytes mapped, bytes resident; images by state."""
    usage: dict[str, Any] = {}
    states: Counter[str] = Counter()
    for obj in _reachable((PublicationImage, LogAppender)):
        if isinstance(obj, PublicationImage):
            owner, log = "images", obj.log
            states[obj.state.value] += 1
        elif isinstance(obj, LogAppender):
            owner, log = "publications", obj.log
        else:
            continue
        row = usage.setdefault(owner, {"count": 0, "open": 0, "mapped": 0, "resident": 0})
        row["count"] += 1
        if not log.maps[0].closed:
            row["open"] += 1
            row["mapped"] += len(log.maps) * log.term_length
            row["resident"] += resident_bytes(log) or 0
    usage["image_states"] = dict(states)
    return usage


#: The lines of ``sys._debugmallocstats()`` kept in a dump, and their keys there.
_PYMALLOC_LINES: dict[str, str] = {
    "arenas allocated current": "arenas",
    "arenas highwater mark": "arenas_highwater",
    "bytes in allocated blocks": "allocated_bytes",
    "bytes in available blocks": "available_bytes",
}


def pymalloc_usage() -> dict[str, int]:
    """Python's small-object allocator: its 1 MiB arenas now and at most, and the bytes of
    their blocks in use and free. An arena goes back to the kernel only once all its blocks
    are free, so arenas growing while allocated bytes do not is fragmentation, not objects.
    Empty while tracemalloc traces (it wraps the allocator, and CPython then prints nothing).
    (CPython prints these on stderr only: fd 2 points at a file for the call.)"""
    with tempfile.TemporaryFile(mode="w+") as out:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(out.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        text = out.read()
    usage: dict[str, int] = {}
    for match in re.finditer(r"^# (.+?)\s+=\s+([\d,]+)$", text, re.MULTILINE):
        key = _PYMALLOC_LINES.get(match[1])
        if key is not None:
            usage[key] = int(match[2].replace(",", ""))
    return usage


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd",
            "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
        )
    ]  # fmt: skip


def glibc_heap_usage() -> dict[str, int] | None:
    """glibc malloc's heap (mallinfo2(3)): bytes it got from the kernel by brk (`heap`) and
    by mmap (`mmapped`), in use, and free inside the heap; None without glibc 2.33+."""
    try:
        mallinfo2 = ctypes.CDLL(None).mallinfo2
    except AttributeError:
        return None
    mallinfo2.restype = _MallInfo2
    info = mallinfo2()
    return {
        "heap": info.arena,
        "mmapped": info.hblkhd,
        "in_use": info.uordblks,
        "free": info.fordblks,
    }


class MemoryProbe:
    """Dumps of the live heap, each compared with the one before (the first: with start-up)."""

    def __init__(self, directory: Path, frames: int = FRAMES) -> None:
        self.directory = directory
        self.dumps = 0
        self.frames = frames
        if frames and not tracemalloc.is_tracing():
            tracemalloc.start(frames)
        self._snapshot = tracemalloc.take_snapshot() if frames else None
        self._types = type_counts()

    def dump(self) -> Path:
        gc.collect()
        snapshot = tracemalloc.take_snapshot() if self._snapshot is not None else None
        types = type_counts()
        grown = (
            snapshot.compare_to(self._snapshot, "traceback")[:TOP]
            if snapshot is not None and self._snapshot is not None
            else []
        )
        type_diff = Counter(types)
        type_diff.subtract(self._types)
        record: dict[str, Any] = {
            "pid": os.getpid(),
            "traced_bytes": tracemalloc.get_traced_memory()[0] if self.frames else None,
            "types_grown": [
                (name, count) for name, count in type_diff.most_common(TOP) if count > 0
            ],
            "types_total": sum(types.values()),
            "logs": log_usage(),
            "pymalloc": pymalloc_usage(),
            "glibc_heap": glibc_heap_usage(),
            "sites_grown": [
                {
                    "size_diff": stat.size_diff,
                    "count_diff": stat.count_diff,
                    "size": stat.size,
                    "traceback": [f"{f.filename}:{f.lineno}" for f in stat.traceback],
                }
                for stat in grown
            ],
        }
        self._snapshot, self._types = snapshot, types
        self.dumps += 1
        path = self.directory / f"memdebug-{os.getpid()}-{self.dumps}.json"
        path.write_text(json.dumps(record, indent=1))
        return path


def probe_from_environment(environ: dict[str, str] | os._Environ[str]) -> MemoryProbe | None:
    """The probe that ``ECHO_MEMDEBUG`` asks for, or None."""
    directory = environ.get(ENV)
    if not directory:
        return None
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    return MemoryProbe(path, int(environ.get(FRAMES_ENV, FRAMES)))


async def serve_probe(
    probe: MemoryProbe, log: Any = None, *, task_status: Any = trio.TASK_STATUS_IGNORED
) -> None:
    """Dump on every SIGUSR1, until cancelled; each dump's path goes to `log` (a structlog
    logger) as ``memdebug_written``, so the operator who sent the signal knows where to look.

    Start it with ``nursery.start`` before the server says it is listening: it reports started
    once the signal is caught, and a SIGUSR1 before that would end the process (the default
    action), as it ended a topics server signalled right after start-up.
    """
    with trio.open_signal_receiver(signal.SIGUSR1) as signals:
        task_status.started()
        async for _ in signals:
            path = probe.dump()
            if log is not None:
                log.warning("memdebug_written", path=str(path), dump=probe.dumps)
