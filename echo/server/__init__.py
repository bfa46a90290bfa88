"""The Echo 2.0 server: the echo application and its trio driver on `echo.session` (whose
config, allocators and limits it uses); `echo.server.server` and `echo.server.cli`.
"""
