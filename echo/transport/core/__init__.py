"""The transport's pure core: the Aeron protocol as state machines, without trio, a clock or a
socket.

Every module here is sans-I/O in the manner of aioquic's `QuicConnection` and h11: a datagram
goes in with the time it arrived (`on_datagram(data, source, now)`), and the core answers what
the driver asks of it: the datagrams to send now (`datagrams_to_send(now)`), when it next
needs the clock (`next_deadline(now)`), what to do when that time comes (`handle_timer(now)`),
and what happened meanwhile (`next_event()`). `now` is always passed in; the core never reads a
clock, never opens a socket and never waits. The trio side that does is `echo.transport.driver`
(docs/architecture.md, "The transport's seam").

Nothing here imports from `echo.transport.driver` or from trio, not even for type checking
(tests/test_purity.py and tests/transport/test_import_graph.py check it on the modules' AST).
"""
