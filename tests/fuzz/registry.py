"""Which echo modules each fuzz harness covers: the harness names, without importing echo.

atheris instruments the modules imported after it starts, so `tests.fuzz.run` reads this
before it imports the harnesses (`tests.fuzz.harnesses`, whose registry has the same names).
"""

from __future__ import annotations

#: The modules whose coverage guides each harness (atheris instruments only these: the start
#: of a run stays short, and the feedback is about the parser, not its neighbours).
COVERS: dict[str, tuple[str, ...]] = {
    "echo_protocol": ("echo.protocol",),
    "session_resume": ("echo.session.resume", "echo.protocol"),
    "aeron_frames": ("echo.transport.core.frames", "echo.transport.core.wireformat"),
    "lobby_protocol": ("echo.lobby.protocol", "echo.codec"),
    "lobby_hello": ("echo.lobby.hello", "echo.codec"),
    "lobby_json": ("echo.lobby.web.jsonwire",),
    "lobby_games": ("echo.lobby.games", "echo.codec"),
    "lobby_listings": ("echo.lobby.listings", "echo.lobby.protocol", "echo.codec"),
    "channels_wire": ("echo.channels.wire", "echo.codec"),
    "topics_codec": ("echo.topics.codec",),
    "tickets": ("echo.tickets.core", "echo.codec"),
    "ticket_key_file": ("echo.tickets.keyfile",),
    "session_handshake": ("echo.session.keywire",),
}
