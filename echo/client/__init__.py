"""Echo 2.0 client (seed 000 §4.6): the pure state machine (`echo.client.machine`), the trio
driver and the CLI.

Nothing is imported here so that importing the pure machine never pulls in trio.
"""
