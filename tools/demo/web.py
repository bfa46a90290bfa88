"""`./dev web-demo`: the lobby from a browser and from Python at once, to the game server.

Four servers start as processes, as a user starts them: echo-topics, echo-lobby with its
WebSocket door and the lobby page (``--ws-port --web``) and a ticket key, echo-server with the
same ticket key, and echo-lobby-announce for it. Then, side by side:

- two Python members on echo's UDP protocol (`echo.lobby`): py-ann creates the lobby; py-dan
  finds it and joins once the two browser members are in;
- two people on the lobby page in real headless Chromium (clients/js/e2e/lobby-page.mjs:
  Debian's chromium driven by playwright-core): web-bea and web-cal filter the list, join,
  chat, set an attribute and ready up.

The browser says hello; py-dan answers; py-ann, the owner, leaves, and the lobby passes to
web-bea, whose page says so; py-ann comes back and readies up; web-bea starts the game from
her page. All four get the game's address and their own ticket, and each ticket is shown to
the real echo-server, which admits it. A browser cannot speak echo's UDP protocol, so the
browser members' tickets (read from their pages) are handed to a Python session client, which
connects with them as the browser's game would. Each side acts on what it sees (the page's
contents, the lobby's events), never on a timer.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import click
import trio

REPO = Path(__file__).resolve().parents[2]
BROWSER_SCRIPT = REPO / "clients" / "js" / "e2e" / "lobby-page.mjs"
PYTHON_MEMBERS = ("py-ann", "py-dan")
BROWSER_MEMBERS = ("web-bea", "web-cal")
OWNER = PYTHON_MEMBERS[0]
# Where each server sits, from the base port: the lobby's UDP ports base..base+33 (16 member
# sessions), its door (and page) base+36, the topic server base+100, the game server
# base+200..base+233.
WS_OFFSET, TOPICS_OFFSET, GAME_OFFSET = 36, 100, 200
PORT_OFFSETS = [*range(37), TOPICS_OFFSET, *range(GAME_OFFSET, GAME_OFFSET + 34)]


@attrs.define
class Stack:
    lobby: str  # HOST:PORT of the lobby's UDP door
    page: str  # the lobby page (and its WebSocket door)
    game: str
    processes: dict[str, subprocess.Popen[bytes]]
    logs: Path


def _tcp_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _wait(process: subprocess.Popen[bytes], log: Path, ready: Any, what: str) -> None:
    deadline = time.monotonic() + 30
    while not ready():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start:\n{log.read_text()[-2000:]}")
        time.sleep(0.05)


@contextmanager
def stack(base: int, logs: Path) -> Iterator[Stack]:
    """The four servers as processes, their output in `logs`; stopped with SIGTERM."""
    from echo.tickets import new_key_text

    logs.mkdir(parents=True, exist_ok=True)
    key = logs / "game.key"
    key.write_text(new_key_text())
    os.chmod(key, 0o600)
    ws, topics, game = base + WS_OFFSET, base + TOPICS_OFFSET, base + GAME_OFFSET
    topics_at = f"127.0.0.1:{topics}"
    commands = {
        "topics": ["echo.topics.serve", "--port", str(topics), "--log-level", "warning"],
        "lobby": ["echo.lobby.cli", "server", "--port", str(base), "--max-clients", "16",
                  "--topics", topics_at, "--ticket-key", str(key), "--ws-port", str(ws),
                  "--web", "--log-format", "json"],
        "game": ["echo.server.cli", "--port", str(game), "--control-port", str(game + 1),
                 "--clients-base-port", str(game + 2), "--max-per-ip", "8",
                 "--duologue-ports", "shared", "--ticket-key", str(key), "--log-format", "json"],
        "announce": ["echo.lobby.cli", "announce", "--topics", topics_at, "--address",
                     f"127.0.0.1:{game}", "--slots", "8", "--interval", "0.5"],
    }
    ready = {
        "topics": lambda log: True,
        "lobby": lambda log: '"listening"' in log.read_text() and _tcp_open(ws),
        "game": lambda log: "listening" in log.read_text(),
        "announce": lambda log: "announcing" in log.read_text(),
    }
    processes: dict[str, subprocess.Popen[bytes]] = {}
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    try:
        for name, argv in commands.items():
            log = logs / f"{name}.log"
            with log.open("wb") as out:
                processes[name] = subprocess.Popen(
                    [sys.executable, "-m", *argv], cwd=REPO, stdout=out,
                    stderr=subprocess.STDOUT, env=env,
                )
            _wait(processes[name], log, lambda log=log, name=name: ready[name](log), name)
        yield Stack(f"127.0.0.1:{base}", f"http://127.0.0.1:{ws}/", f"127.0.0.1:{game}",
                    processes, logs)
    finally:
        for process in reversed(processes.values()):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


# --- the scenario -----------------------------------------------------------------------------


@attrs.define
class Report:
    """What each side saw: lines per member, tickets per member, the game server's answers."""

    saw: dict[str, list[str]] = attrs.Factory(dict)
    tickets: dict[str, tuple[str, bytes]] = attrs.Factory(dict)  # member -> (address, ticket)
    admitted: dict[str, str] = attrs.Factory(dict)  # member -> the game server's answer
    browser_exit: int | None = None
    screenshots: list[Path] = attrs.Factory(list)

    def said(self, who: str, text: str) -> None:
        self.saw.setdefault(who, []).append(text)

    @property
    def everyone_in_the_game(self) -> bool:
        everyone = {*PYTHON_MEMBERS, *BROWSER_MEMBERS}
        return self.browser_exit == 0 and all(
            self.admitted.get(m, "").startswith(f"ECHO {m} ") for m in everyone
        )


async def _py_member(name: str, server: str, mode: str, report: Report) -> None:
    import echo.lobby.client as lc
    from echo.lobby.protocol import ChatLine, ErrorCode, GameStarting, OwnerChanged

    def others_ready(lobby: lc.LobbyClient) -> bool:
        replica = lobby.replica
        return replica is not None and len(replica.members) == 4 and all(
            m.ready for m in replica.members.values() if m.member_id != name
        )

    async with lc.connect([server], member=name) as lobby:
        if name == OWNER:
            lobby_id = await lobby.create("Web night", 4, metadata={"mode": mode})
            report.said(name, f"created lobby {lobby_id:x} (mode {mode})")
        else:
            # join once both browser members are in (they take the seats after the owner's)
            while True:
                try:
                    found = await lobby.search(lc.filters_from(equals={"mode": mode}))
                except lc.LobbyError as error:
                    if error.code is not ErrorCode.RATE_LIMITED:
                        raise
                    await trio.sleep(lc.retry_after(error.message))
                    continue
                if found.listings and found.listings[0].member_count >= 3:
                    break
                await trio.sleep(1.0)  # listings have no change event: ask again
            lobby_id = await lobby.join(found.listings[0].lobby_id)
            report.said(name, f"joined lobby {lobby_id:x}")
        heard = False
        left = False
        async for event in lobby.events():
            if isinstance(event, ChatLine) and event.member_id.startswith("web-") and not heard:
                heard = True
                report.said(name, f"chat <{event.member_id}> {event.text}")
                if name != OWNER:
                    await lobby.chat("hello from python")
                    await lobby.ready()
                    report.said(name, "said hello back and is ready")
            elif isinstance(event, OwnerChanged):
                report.said(name, f"owner is now {event.owner}")
            elif isinstance(event, GameStarting):
                report.tickets[name] = (event.address, event.ticket)
                report.said(name, f"game on {event.address}: ticket of {len(event.ticket)} bytes")
                await _admit(name, event.address, event.ticket, report)
                return
            if name == OWNER and not left and others_ready(lobby):
                left = True
                await lobby.leave()
                report.said(name, "everyone else is ready: left the lobby (the owner leaves)")
                await lobby.join(lobby_id)
                await lobby.ready()
                report.said(name, "came back and is ready")


async def _browser(page: str, mode: str, shots: Path, report: Report, timeout: float) -> None:
    node = shutil.which("node")
    if node is None:
        raise RuntimeError("node is not installed (./dev test installs Debian's nodejs)")
    argv = [node, str(BROWSER_SCRIPT), "--page", page, "--mode", mode, "--out", str(shots),
            "--timeout", str(int(timeout * 1000)), "--owner", OWNER]
    process = await trio.lowlevel.open_process(
        argv, stdout=subprocess.PIPE, cwd=BROWSER_SCRIPT.parents[1]
    )
    assert process.stdout is not None
    buffered = b""
    try:
        async with process.stdout, trio.open_nursery() as admissions:
            async for chunk in process.stdout:
                buffered += chunk
                *lines, buffered = buffered.split(b"\n")
                for line in lines:
                    ticket = _browser_line(line.decode(errors="replace"), report)
                    if ticket is not None:  # shown to the game server at once, as a game would
                        admissions.start_soon(_admit, *ticket, report)
                        if ticket[0] == BROWSER_MEMBERS[-1]:  # and a forged copy, refused
                            _, address, good = ticket
                            forged = good[:-1] + bytes([good[-1] ^ 1])
                            admissions.start_soon(_admit, "forged", address, forged, report)
            await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            with trio.CancelScope(shield=True):
                await process.wait()
    report.browser_exit = process.returncode
    report.screenshots = sorted(await trio.to_thread.run_sync(lambda: list(shots.glob("*.png"))))


def _browser_line(line: str, report: Report) -> tuple[str, str, bytes] | None:
    """Record one line of the browser script; a member's (name, address, ticket) if it has one."""
    try:
        said = json.loads(line)
    except ValueError:
        report.said("browser", line)
        return None
    who = said.pop("who", "browser")
    what = said.pop("saw", "")
    found = None
    if what == "game starting" and "ticket" in said:
        ticket = base64.b64decode(said.pop("ticket"))
        report.tickets[who] = (said["address"], ticket)
        said["ticket_bytes"] = len(ticket)
        found = (who, said["address"], ticket)
    detail = ", ".join(f"{k}={v}" for k, v in said.items())
    report.said(who, f"{what}{': ' + detail if detail else ''}")
    return found


async def _admit(name: str, address: str, ticket: bytes, report: Report) -> None:
    """Show `ticket` to the game server, as `name`'s game would, and say something there."""
    import echo.session as es

    host, port = address.rsplit(":", 1)
    try:
        async with es.connect(
            host, int(port), int(port) + 1, credentials=ticket, timeout=10,
            duologue_ports="shared",
        ) as game:
            await game.send(f"ECHO {name} is in the game".encode())
            report.admitted[name] = (await game.receive()).decode()
    except es.Rejected as refused:
        report.admitted[name] = f"refused: {refused.reason}"


async def scenario(
    the: Stack, shots: Path, *, mode: str = "web-demo", timeout: float = 90.0
) -> Report:
    """Run the browser and the Python members to the game server; what each side saw."""
    report = Report()
    with trio.move_on_after(timeout) as overall:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_browser, the.page, mode, shots, report, timeout)
            # the owner's lobby first, so that the browser members find it; py-dan waits for them
            nursery.start_soon(_py_member, OWNER, the.lobby, mode, report)
            nursery.start_soon(_py_member, PYTHON_MEMBERS[1], the.lobby, mode, report)
    if overall.cancelled_caught:
        report.said("demo", f"gave up after {timeout:.0f} s")
    return report


def show(report: Report) -> None:
    for who in (*PYTHON_MEMBERS, *BROWSER_MEMBERS, "browser", "demo"):
        lines = report.saw.get(who)
        if not lines:
            continue
        where = {"web-": " [browser]", "py-": " [python (UDP)]"}.get(who[: who.find("-") + 1], "")
        print(f"\n{who}{where} saw:")
        for line in lines:
            print(f"  {line}")
    print("\nthe game server (echo-server --ticket-key):")
    for name in (*PYTHON_MEMBERS, *BROWSER_MEMBERS, "forged"):
        via = {"web": " (the browser's ticket, shown by a Python session client)",
               "for": f" ({BROWSER_MEMBERS[-1]}'s ticket with one bit changed)"}.get(name[:3], "")
        print(f"  {name}: {report.admitted.get(name, 'no ticket')}{via}")
    if report.screenshots:
        print(f"\n{len(report.screenshots)} screenshots in {report.screenshots[0].parent}")


@click.command()
@click.option("--port", default=7700, show_default=True, type=click.IntRange(1, 65535 - 233),
              help="Base port: the lobby's UDP port; its page and door +36, topics +100, "
                   "the game server +200.")
@click.option("--out", type=click.Path(path_type=Path), default=REPO / "artifacts" / "web-demo",
              show_default=True, help="Screenshots of the browser's pages and the servers' logs.")
def main(port: int, out: Path) -> None:
    """Run the web demo: servers, two Python members, two browser members, one game."""
    from echo.log import configure_logging

    configure_logging("console", "warning")
    shutil.rmtree(out, ignore_errors=True)
    try:
        with stack(port, out / "logs") as the:
            print(f"echo-lobby on {the.lobby} (UDP), its page and WebSocket door on {the.page}")
            print(f"echo-server on {the.game} with --ticket-key; echo-topics; an announcer")
            print("py-ann and py-dan on UDP; web-bea and web-cal on the page in headless "
                  "Chromium...")
            report = trio.run(scenario, the, out / "screenshots")
    except RuntimeError as error:  # a server that did not start, node missing
        print(f"web-demo: {error}", file=sys.stderr)
        sys.exit(1)
    show(report)
    ok = report.everyone_in_the_game
    print("\nall four reached the game server" if ok else "\nnot everyone reached the game server")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":  # pragma: no cover
    main()
