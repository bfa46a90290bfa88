"""R1: how fast a killed member is back in its seat, and how fast a lobby of killed members
leaves search (the ghost-lobby time).

    python -m bench.resume_bench --repeats 5

Everything runs as a user runs it: one `echo-lobby` process on loopback; the members that are
killed are `echo-lobby-client` processes (`--state-file`, `--json`), killed with SIGKILL; the
bench process itself holds the members that watch (the lobby's owner and the searchers), with
the Python library. Per repeat:

- **resume, process**: bob (a client process) joins the owner's lobby, readies up and is
  killed; a new `echo-lobby-client` with the same state file is started. Measured from the
  start of the new process to its `resumed` line, and to the owner seeing bob connected again
  (ready state and attributes back). Next to it, in the same repeat, the baseline: how long
  that interpreter takes to import the client (`python -c "import echo.lobby.cli"`): what a
  restart costs before any network traffic.
- **resume, library**: a member of the bench process whose session was dropped without
  leaving takes its seat back with `echo.lobby.connect(..., resume_token=...)`; from the call
  to the seat, next to a fresh member's connect and join of the same lobby in the same repeat.
- **ghost**: carol (a client process) creates a lobby alone and is killed; from the kill to
  the lobby's absence from search (searchers ask every 50 ms, each under its own search rate
  limit), against the server's member liveness bound (2.5 s).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import attrs
import trio

import echo.lobby
from bench import results as result_files
from bench.harness import Target
from echo.lobby.client import LobbyClient
from echo.lobby.protocol import Presence

REPO = Path(__file__).resolve().parents[1]
LOBBY = [sys.executable, "-m", "echo.lobby.cli", "server"]
CLIENT = [sys.executable, "-m", "echo.lobby.cli", "client"]
SEARCHERS = 20  # 50 ms apart, each searching once a second (the search rate limit's rate)
SPAN = 40  # the ports echo-lobby binds from --port on
GHOST_BOUND_MS = 2500.0  # the server's member liveness (echo.lobby.timers.MEMBER_LIVENESS)


@attrs.frozen
class Figure:
    name: str
    metric: str
    value: float
    unit: str = "ms"
    lower_is_better: bool = True
    baseline: tuple[str, str] | None = None
    target: Any = None


def random_base() -> int:
    return random.randrange(20_000, 30_000, 2 * SPAN)


@contextmanager
def lobby_server(log: IO[bytes], bases: Callable[[], int] = random_base) -> Iterator[str]:
    """`echo-lobby` on a free loopback range from `bases` (another program may take a probed
    port: the start is tried again on another range)."""
    for _ in range(10):
        port = bases()
        log.seek(0)
        log.truncate()
        process = subprocess.Popen(
            [*LOBBY, "--port", str(port), "--max-clients", "64", "--log-format", "json"],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        text = b""
        deadline = time.monotonic() + 60
        while b'"listening"' not in text and process.poll() is None:
            if time.monotonic() > deadline:
                process.kill()
                raise RuntimeError("echo-lobby did not start within 60 s")
            time.sleep(0.05)  # (another process's log: nothing to await)
            text = Path(log.name).read_bytes()
        if process.poll() is None:
            try:
                yield f"127.0.0.1:{port}"
            finally:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=30)
            return
        if b"Address already in use" not in text:
            raise RuntimeError(f"echo-lobby failed: {text.decode(errors='replace')[-2000:]}")
    raise RuntimeError("no free port range for echo-lobby")


class MemberProcess:
    """An `echo-lobby-client --json` process fed commands; its lines read on a thread-free
    trio stream."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self._buffer = b""

    @classmethod
    async def start(cls, server: str, member: str, state: Path) -> MemberProcess:
        argv = [*CLIENT, "--servers", server, "--member", member, "--json"]
        argv += ["--state-file", str(state)]
        process = await trio.lowlevel.open_process(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=REPO
        )
        return cls(process)

    async def send(self, line: str) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send_all(line.encode() + b"\n")

    async def until_event(self, event: str) -> dict[str, Any]:
        assert self.process.stdout is not None
        while True:
            while b"\n" not in self._buffer:
                chunk = await self.process.stdout.receive_some(65536)
                if not chunk:
                    raise RuntimeError(f"the client exited before {event!r}")
                self._buffer += chunk
            line, self._buffer = self._buffer.split(b"\n", 1)
            record = json.loads(line)
            if record.get("event") == event:
                return record

    async def kill(self) -> None:
        self.process.kill()
        await self.process.wait()


def import_time() -> float:
    """Seconds for a fresh interpreter to import the lobby client (the restart's floor)."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import echo.lobby.cli"], cwd=REPO, check=True)
    return time.perf_counter() - start


def bob_is_back(owner: LobbyClient) -> bool:
    replica = owner.replica
    bob = replica.members.get("bob") if replica is not None else None
    return bob is not None and bob.presence is Presence.CONNECTED and bob.ready


async def process_resume(server: str, owner: LobbyClient, lobby_id: int, work: Path) -> dict:
    state = work / "bob.state"
    bob = await MemberProcess.start(server, "bob", state)
    await bob.send(f"join {lobby_id}")
    await bob.send("ready")
    await bob.until_event("token_saved")
    await owner.wait_until(bob_is_back, timeout=30)
    await bob.kill()
    await owner.wait_until(lambda o: not bob_is_back(o), timeout=30)
    start = time.perf_counter()
    bob = await MemberProcess.start(server, "bob", state)
    await bob.until_event("resumed")
    printed = time.perf_counter() - start
    await owner.wait_until(bob_is_back, timeout=30)
    seen = time.perf_counter() - start
    await bob.send("leave")
    await bob.until_event("ok")
    await bob.kill()
    return {"printed": printed, "seen": seen}


async def library_resume(server: str, lobby_id: int, n: int) -> dict:
    async with echo.lobby.connect([server], member=f"lib{n}") as dave:
        await dave.join(lobby_id)
        await dave.wait_until(lambda c: c.resume_token is not None)
        token = dave.resume_token
    assert token is not None
    start = time.perf_counter()
    async with echo.lobby.connect([server], member=f"lib{n}", resume_token=token) as dave:
        resumed = time.perf_counter() - start
        await dave.leave()
    start = time.perf_counter()
    async with echo.lobby.connect([server], member=f"fresh{n}") as fresh:
        await fresh.join(lobby_id)
        joined = time.perf_counter() - start
        await fresh.leave()
    return {"resumed": resumed, "joined": joined}


async def ghost(server: str, searchers: list[LobbyClient], work: Path, n: int) -> float:
    carol = await MemberProcess.start(server, f"carol{n}", work / f"carol{n}.state")
    name = f"ghost-{n}-{os.getpid()}"
    await carol.send(f"create {name} 4")
    await carol.until_event("joined")
    turn = 0

    async def listed() -> bool:
        nonlocal turn
        searcher = searchers[turn % len(searchers)]
        turn += 1
        return any(x.name == name for x in await searcher.search_all())

    # Search is the only view of another process's lobby: asked again until it shows it.
    while not await listed():  # noqa: ASYNC110
        await trio.sleep(0.05)
    await carol.kill()
    killed = time.perf_counter()
    while await listed():  # noqa: ASYNC110
        await trio.sleep(1 / SEARCHERS)  # (a search every 50 ms: each searcher once a second)
    return time.perf_counter() - killed


async def one_repeat(server: str, n: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="echo-resume-") as tmp:
        work = Path(tmp)
        async with echo.lobby.connect([server], member=f"owner{n}") as owner:
            lobby_id = await owner.create(f"resume-{n}", 8)
            proc = await process_resume(server, owner, lobby_id, work)
            lib = await library_resume(server, lobby_id, n)
            async with trio.open_nursery() as nursery:
                searchers: list[LobbyClient] = []
                for i in range(SEARCHERS):
                    client = await nursery.start(_searcher, server, f"s{n}-{i}")
                    searchers.append(client)
                ghost_s = await ghost(server, searchers, work, n)
                nursery.cancel_scope.cancel()
    floor = await trio.to_thread.run_sync(import_time)
    return {
        "resume_process_printed": proc["printed"] * 1000,
        "resume_process_seen": proc["seen"] * 1000,
        "import_floor": floor * 1000,
        "resume_library": lib["resumed"] * 1000,
        "join_library": lib["joined"] * 1000,
        "ghost": ghost_s * 1000,
    }


async def _searcher(server: str, member: str, *, task_status: Any) -> None:
    async with echo.lobby.connect([server], member=member) as client:
        task_status.started(client)
        await trio.sleep_forever()


def figures(run: dict[str, float]) -> dict[tuple[str, str], Figure]:
    under_1s = Target("<=", 1000.0)
    out = [
        Figure("resume_process", "start to 'resumed'", run["resume_process_printed"],
               baseline=("python_import", "import echo.lobby.cli"), target=under_1s),
        Figure("resume_process", "start to seen by others", run["resume_process_seen"],
               baseline=("python_import", "import echo.lobby.cli"), target=under_1s),
        Figure("python_import", "import echo.lobby.cli", run["import_floor"]),
        Figure("resume_library", "connect(resume_token) to seated", run["resume_library"],
               baseline=("join_library", "connect and join"), target=under_1s),
        Figure("join_library", "connect and join", run["join_library"]),
        Figure("ghost_lobby", "kill to out of search", run["ghost"],
               target=Target("<=", GHOST_BOUND_MS, note="the 2.5 s member liveness bound")),
    ]  # fmt: skip
    return {(f.name, f.metric): f for f in out}


def measure(repeats: int, bases: Callable[[], int] = random_base) -> list[dict[str, float]]:
    """Every repeat's figures (ms), on one `echo-lobby` process."""
    runs = []
    with tempfile.NamedTemporaryFile(prefix="echo-lobby-", suffix=".log") as log:
        with lobby_server(log, bases) as server:
            for n in range(repeats):
                run = trio.run(one_repeat, server, n)
                print(f"repeat {n + 1}: " + ", ".join(f"{k} {v:.0f} ms" for k, v in run.items()),
                      "| load", open("/proc/loadavg").read().split()[:3], flush=True)  # fmt: skip
                runs.append(run)
    return runs


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--results-dir", default=str(result_files.RESULTS_DIR))
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    load_before = result_files.system_load()
    runs = measure(args.repeats)
    repeats = [figures(run) for run in runs]
    own = [key for key in repeats[0] if key[0] not in ("python_import", "join_library")]
    record, left_out = result_files.from_repeats(
        bench_id="resume",
        label="R1",
        title="R1: a killed member back in its seat (echo-lobby-client --state-file, and the "
        "library's resume token), and a lobby of killed members out of search",
        command=("python -m bench.resume_bench " + " ".join(argv or sys.argv[1:])).strip(),
        own=own,
        repeats=repeats,
        machine=result_files.machine_info(load_before, result_files.system_load()),
        settings={"searchers": SEARCHERS, "repeats": args.repeats},
        labels={"python_import": "the interpreter's import of the client, same repeat",
                "join_library": "a fresh member's connect and join, same repeat"},
    )  # fmt: skip
    for line in left_out:
        print("left out:", line)
    for key in repeats[0]:
        values = [r[key].value for r in repeats]
        print(f"{key[0]} {key[1]}: median {statistics.median(values):.0f} ms "
              f"(min {min(values):.0f}, max {max(values):.0f})")  # fmt: skip
    if record is not None and not args.no_write:
        print("wrote", record.write(Path(args.results_dir)))


if __name__ == "__main__":
    main()
