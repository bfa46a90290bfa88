"""Topics: soft-state publish/subscribe over many dumb servers for smart clients.

The design is Kragen Sitaker's note on decentralized application-layer multicast (the
soft-state publish/subscribe note; docs/architecture.md lists the sources).

Servers (``echo-topics``) keep subscriptions for N seconds and forward publishes; clients
(``echo-topic``, or this library) pick each topic's servers by consistent hashing, refresh,
resend and deduplicate. The codec, the server core and the client core are pure; the trio
parts are ``TopicServer`` and ``open_topic_client``.
"""

from echo.topics.client import (
    ClientConfig,
    Message,
    TopicClient,
    open_topic_client,
    parse_servers,
    read_servers_file,
)
from echo.topics.driver import TopicServer
from echo.topics.server import ServerConfig

__all__ = [
    "ClientConfig",
    "Message",
    "ServerConfig",
    "TopicClient",
    "TopicServer",
    "open_topic_client",
    "parse_servers",
    "read_servers_file",
]
