"""Network-namespace test lab: a public server and clients behind real nftables NAT routers.

See ``tests/netlab/lab.py`` (``nat_lab``) and docs/architecture.md, Test layers.
"""
