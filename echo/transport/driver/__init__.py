"""The transport's trio side: sockets, the one reader and timer loop, lending, wiring.

It reads the clock (`trio.current_time()`), reads and writes the sockets and schedules the
wake-ups; everything the protocol decides is asked of the pure core (`echo.transport.core`)
with `now` passed in (docs/architecture.md, "The transport's seam"). The modules, from the
bottom up: `readiness` (one epoll set), `sockets` (a socket and its endpoint), `lending`
(an application task reading its subscription's socket), `channels` (what the api calls),
`wiring` and `response_wiring` (a stream's sockets and state), `loop` (the `Driver`).
"""
