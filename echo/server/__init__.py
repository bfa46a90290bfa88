"""Echo 2.0 server (the io7m Aeron guide §4.5): config, allocators and limits (pure), duologues,
trio server.

Nothing is imported here so that importing a pure submodule never pulls in trio.
"""
