"""Echo 2.0 client (the io7m Aeron guide §4.6): the ECHO application as a pure state machine
(`echo.client.application`), its trio driver on `echo.session.connect()` (`echo.client.client`)
and the CLI.

Nothing is imported here so that importing the pure machine never pulls in trio.
"""
