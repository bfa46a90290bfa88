"""The `./dev` demos: the real CLIs started as processes on loopback (and the transport alone)."""
