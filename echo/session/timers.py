"""Transport timers for session servers and clients (Echo 2.0 and others; docs/configuration.md).

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
  datagram) and the rare tail whose probe was lost too: every 0.5 s. It could not be much
  calmer. The anti-amplification budget (image.py: an image sends its source at most
  AMPLIFICATION_FACTOR = 3 times the bytes it received from it) lets an idle stream's 36-byte
  status messages be paid for only by its 32-byte heartbeats, so they must come at least 36/96
  times as often (2.67 s at most against one SM a second): not the bound that binds. But a
  server cannot see its peers' liveness timeouts: the lobby client's
  images end after 1.5 s (echo.lobby.client.CLIENT_LIVENESS), which 0.5 s heartbeats cover
  three times. 0.8 s was tried: it saved nothing at B4's one echo a second
  per client (a 1 s data interval still has one idle heartbeat in it) and would have left the
  lobby's clients one lost heartbeat from losing their server.
  With a shorter image liveness timeout than the default the heartbeat follows it, at most a
  third of it.
"""

from __future__ import annotations

from typing import Any

import attrs

from echo.transport.core.config import TransportConfig
from echo.transport.core.frames import DATA_HEADER_LENGTH, SM_LENGTH
from echo.transport.core.image import AMPLIFICATION_FACTOR

ECHO_STATUS_MESSAGE_INTERVAL = 1.0
ECHO_HEARTBEAT_INTERVAL = 0.5
#: the longest idle heartbeat interval, over the status message interval, whose heartbeats (a
#: bare 32-byte data header, credited AMPLIFICATION_FACTOR times) still pay for one status
#: message (36 bytes) per status message interval (see above)
MAX_BUDGETED_HEARTBEAT_RATIO = AMPLIFICATION_FACTOR * DATA_HEADER_LENGTH / SM_LENGTH
#: an image's liveness timeout spans at least this many idle heartbeats
HEARTBEATS_PER_LIVENESS = 3


def echo_timers(base: TransportConfig | None = None, **overrides: Any) -> TransportConfig:
    """`base` (or Aeron's defaults) with the sessions' idle cadence; `overrides` win.

    The idle heartbeat is at most a third of the image liveness timeout in effect, and an
    `overrides` status message interval takes the heartbeat with it (the budget above); an
    explicit `heartbeat_interval` wins.
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
