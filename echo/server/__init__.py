"""Echo 2.0 server (seed 000 §4.5): config, allocators and limits (pure), duologues, trio server.

Nothing is imported here so that importing a pure submodule never pulls in trio.
"""
