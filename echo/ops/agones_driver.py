"""The trio driver of the Agones SDK client (echo.ops.agones decides, this module calls).

    agones = AgonesClient.from_environment()      # localhost:$AGONES_SDK_HTTP_PORT
    server = SessionServer(config, app, events=agones.session_events(events))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(agones.run)
        await nursery.start(server.run)
        agones.listening()                         # POST /ready, then Health on a period
        ...                                        # sessions open and close: player tracking
        await agones.game_over.wait()              # /shutdown sent: the last player left
        # or, on SIGTERM after the drain:  await agones.shutdown(timeout=10)

`session_events` is the session library's hook: the `events` sink of `SessionServer` (it
passes every event on to the sink it wraps) reports each session that opens
("duologue_connected") and ends ("duologue_closed") as a player that connects and
disconnects. Any game server on the session library gets Agones this way, echo-server's
`--agones` included.

The sidecar being down, late or wrong never stops the game: each failure is logged (once
until the sidecar answers again) and the call is tried again later.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from contextlib import aclosing
from typing import Any

import structlog
import trio

from echo.ops import httpclient
from echo.ops.agones import (
    WATCH_PATH,
    Agones,
    Backoff,
    Call,
    Verdict,
    parse_watch_line,
    sidecar_port,
)

__all__ = ["REQUEST_TIMEOUT", "AgonesClient", "SessionEvents"]

log = structlog.get_logger("echo.ops.agones")

#: Seconds one call may take before it counts as not answered.
REQUEST_TIMEOUT = 5.0
#: The sidecar listens on the pod's loopback (Agones' REST page: localhost).
SIDECAR_HOST = "localhost"


class AgonesClient:
    """Talks to one SDK sidecar for one game server: `run` in a nursery, then report."""

    def __init__(self, port: int, machine: Agones | None = None, host: str = SIDECAR_HOST):
        self.host = host
        self.port = port
        self.machine = machine or Agones()
        #: set once /shutdown was answered (or given up): the game server may go
        self.game_over = trio.Event()
        #: the calls made and their verdicts, in order (for the logs and the tests)
        self.calls: list[tuple[str, Verdict]] = []
        self._changed = trio.Event()
        self._failing = False

    @classmethod
    def from_environment(
        cls, environ: Mapping[str, str] | None = None, **options: Any
    ) -> AgonesClient:
        """The sidecar at localhost:$AGONES_SDK_HTTP_PORT (9358 if unset); ValueError for a
        value that is no port."""
        return cls(sidecar_port(os.environ if environ is None else environ), Agones(**options))

    # -------------------------------------------------------------- what the game reports

    def _poke(self) -> None:
        self._changed.set()

    def listening(self) -> None:
        self.machine.listening(trio.current_time())
        self._poke()

    def session_opened(self, player: str) -> None:
        self.machine.session_opened(player, trio.current_time())
        self._poke()

    def session_closed(self, player: str) -> None:
        self.machine.session_closed(player, trio.current_time())
        self._poke()

    def allocate(self) -> None:
        self.machine.allocate(trio.current_time())
        self._poke()

    def reserve(self, seconds: int) -> None:
        self.machine.reserve(seconds, trio.current_time())
        self._poke()

    async def shutdown(self, timeout: float) -> bool:
        """/shutdown after what is still queued; wait for it up to `timeout` seconds. True if
        the sidecar heard it; else it is given up (logged) and nothing more is sent."""
        self.machine.request_shutdown(trio.current_time())
        self._poke()
        with trio.move_on_after(timeout):
            await self.game_over.wait()
        if not self.machine.shut_down:
            log.warning("agones_shutdown_unanswered", timeout_s=timeout, port=self.port)
            self.machine.give_up_shutdown()
            self.game_over.set()
            return False
        return True

    def session_events(
        self, inner: Any = None, player_id: Callable[[dict[str, Any]], str] | None = None
    ) -> SessionEvents:
        """The `events` sink for a SessionServer: `inner` gets every event as before."""
        return SessionEvents(self, inner, player_id)

    # -------------------------------------------------------------- the calls

    async def run(self) -> None:
        """Make the calls the state machine asks for, and watch the GameServer, until
        cancelled. A failure of its own (a bug) is logged and ends the Agones client only:
        the game server goes on without it."""
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch)
                await self._calls()
        except Exception as error:
            log.error("agones_client_failed", error=repr(error), exc_info=error)

    async def _calls(self) -> None:
        machine = self.machine
        while True:
            call = machine.next_call(trio.current_time())
            if call is None:
                wake = machine.wake_at()
                with trio.move_on_at(math.inf if wake is None else wake):
                    await self._changed.wait()
                self._changed = trio.Event()
                continue
            status, body, problem = await self._send(call)
            verdict = machine.completed(call, status, body, trio.current_time())
            self.calls.append((call.name, verdict))
            self._log(call, status, problem, verdict)
            if machine.shut_down:
                self.game_over.set()

    async def _send(self, call: Call) -> tuple[int | None, bytes, str | None]:
        try:
            status, body = await httpclient.request(
                self.host, self.port, call.method, call.path, call.body, REQUEST_TIMEOUT
            )
        except httpclient.Unreachable as error:
            return None, b"", str(error)
        return status, body, None

    def _log(self, call: Call, status: int | None, problem: str | None, verdict: Verdict) -> None:
        if status is None:
            if not self._failing:  # once, until the sidecar answers again
                self._failing = True
                log.warning("agones_sidecar_unreachable", call=call.name, port=self.port,
                            error=problem, retrying=verdict is Verdict.RETRY)  # fmt: skip
            return
        if self._failing:
            self._failing = False
            log.info("agones_sidecar_answers", port=self.port)
        if verdict is Verdict.DONE:
            if call.name != "health":
                log.info("agones_" + call.name, player=call.player)
        else:
            log.warning("agones_call_refused", call=call.name, status=status,
                        player=call.player, verdict=verdict.value)  # fmt: skip

    async def _watch(self) -> None:
        """Follow /watch/gameserver: each GameServer it sends goes to the state machine;
        a broken stream is opened again after a backoff."""
        backoff = Backoff()
        while True:
            try:
                lines = httpclient.stream_lines(self.host, self.port, WATCH_PATH, REQUEST_TIMEOUT)
                async with aclosing(lines):
                    async for line in lines:
                        backoff.reset()
                        self._watched(line)
            except httpclient.Unreachable as error:
                log.debug("agones_watch_failed", error=str(error))
            await trio.sleep(backoff.next_delay())

    def _watched(self, line: bytes) -> None:
        gameserver = parse_watch_line(line)
        if gameserver is None:
            log.debug("agones_watch_line_ignored", line=line[:200])
            return
        before, now_state = self.machine.gameserver_seen(gameserver, trio.current_time())
        if before != now_state:
            log.info("agones_state", state=now_state, was=before)
        self._poke()


class SessionEvents:
    """An `EventSink` for `SessionServer(events=...)`: passes every event to `inner` and
    reports sessions to Agones as players (id: "session-<duologue id>" unless `player_id`
    makes one from the "duologue_connected" event's fields)."""

    def __init__(
        self,
        agones: AgonesClient,
        inner: Any = None,
        player_id: Callable[[dict[str, Any]], str] | None = None,
    ) -> None:
        self.agones = agones
        self.inner = inner
        self.player_id = player_id or (lambda fields: f"session-{fields['duologue_id']}")
        self._open: dict[Any, str | None] = {}

    def emit(self, event: str, **fields: Any) -> None:
        if self.inner is not None:
            self.inner.emit(event, **fields)
        if event == "duologue_connected":
            player = self.player_id(fields)
            self._open[fields.get("duologue_id")] = player
            self.agones.session_opened(player)
        elif event == "duologue_closed":
            gone = self._open.pop(fields.get("duologue_id"), None)
            if gone is not None:
                self.agones.session_closed(gone)
