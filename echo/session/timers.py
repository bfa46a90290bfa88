"""Transport timers for session servers and clients (Echo 2.0 and others; README "Configuration").

Aeron's defaults (heartbeat every 100 ms idle, status message every 200 ms) were made for a few
busy streams. A server with 1,000 duologues runs 2,000 streams that are idle most of the time:
at Aeron's rates the server alone sends about 15,000 heartbeats and status messages a second
(and receives as many), each a system call and a wake-up on both ends; at echo's, about 3,000.
Echo streams use 0.5 s heartbeats and 1 s status messages, which keeps liveness (10 s image
timeout, 5 s publication timeout) several intervals away, and send one probe heartbeat 2 ms
after each burst of data instead, so a lost last message (a lost echo) is repaired in
milliseconds rather than after a full idle interval.
"""

from __future__ import annotations

from typing import Any

import attrs

from echo.transport import TransportConfig

# Heartbeats twice as often as status messages: an image sends the (unvalidated) source of its
# SETUP no more bytes than it received from it, and 2 x 32-byte heartbeats pay for one 36-byte SM.
ECHO_HEARTBEAT_INTERVAL = 0.5
ECHO_STATUS_MESSAGE_INTERVAL = 1.0


def echo_timers(base: TransportConfig | None = None, **overrides: Any) -> TransportConfig:
    return attrs.evolve(
        base or TransportConfig(),
        heartbeat_interval=ECHO_HEARTBEAT_INTERVAL,
        status_message_interval=ECHO_STATUS_MESSAGE_INTERVAL,
        probe_after_data=True,
        **overrides,
    )
