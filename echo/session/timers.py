"""Transport timers for session servers and clients (Echo 2.0 and others; README "Configuration").

Aeron's defaults (heartbeat every 100 ms idle, status message every 200 ms) were made for a few
busy streams. A server with 1,000 duologues runs 2,000 streams that are idle most of the time:
at Aeron's rates the server alone sends about 15,000 heartbeats and status messages a second
(and receives as many), each a system call and a wake-up on both ends. Sessions are echo to
echo, so they choose their own idle cadence (the plain transport keeps Aeron's):

- a status message every second: a publication counts its receiver gone 5 s after the last one
  (publication_connection_timeout), so four in a row may be lost first; flow control does not
  wait for the timer (an image sends one as soon as its subscriber consumed a quarter window);
- one probe heartbeat 2 ms after each burst of data (probe_after_data), so a lost last message
  (a lost echo) is NAKed and repaired in milliseconds instead of after an idle interval;
- so the idle heartbeat's remaining jobs are liveness (an image ends 10 s after the last
  datagram) and the rare tail whose probe was lost too. Its interval is bound by the
  anti-amplification budget (image.py: an image sends its source no more bytes than it
  received from it): on an idle stream the 32-byte heartbeats are all that pays for the 36-byte
  status messages, so they come at least 36/32 times as often: every 0.8 s, against one SM a
  second (0.5 s before: 6 datagrams a second per idle duologue at the server, now 4.5).
  With a shorter image liveness timeout (the lobby client's 1.5 s) the heartbeat follows it,
  at most a third of it.
"""

from __future__ import annotations

from typing import Any

import attrs

from echo.transport import TransportConfig
from echo.transport.frames import DATA_HEADER_LENGTH, SM_LENGTH

ECHO_STATUS_MESSAGE_INTERVAL = 1.0
#: the longest idle heartbeat interval whose heartbeats (a bare 32-byte data header) pay for
#: one status message (36 bytes) per interval is 32/36 of it (0.89 s); a tenth less leaves a
#: margin for heartbeats sent late: 0.8 s
ECHO_HEARTBEAT_INTERVAL = round(
    0.9 * ECHO_STATUS_MESSAGE_INTERVAL * DATA_HEADER_LENGTH / SM_LENGTH, 2
)
#: an image's liveness timeout spans at least this many idle heartbeats
HEARTBEATS_PER_LIVENESS = 3


def echo_timers(base: TransportConfig | None = None, **overrides: Any) -> TransportConfig:
    """`base` (or Aeron's defaults) with the sessions' idle cadence; `overrides` win.

    The idle heartbeat is at most a third of the image liveness timeout in effect, and an
    `overrides` status message interval takes the heartbeat with it (the budget above).
    """
    config = base or TransportConfig()
    liveness = overrides.get("image_liveness_timeout", config.image_liveness_timeout)
    status = overrides.get("status_message_interval", ECHO_STATUS_MESSAGE_INTERVAL)
    heartbeat = min(
        ECHO_HEARTBEAT_INTERVAL * status / ECHO_STATUS_MESSAGE_INTERVAL,
        liveness / HEARTBEATS_PER_LIVENESS,
    )
    settings: dict[str, Any] = {
        "heartbeat_interval": heartbeat,
        "status_message_interval": ECHO_STATUS_MESSAGE_INTERVAL,
        "probe_after_data": True,
    }
    settings.update(overrides)
    return attrs.evolve(config, **settings)
