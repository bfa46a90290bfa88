"""What a lobby member and its servers agree on: the lobby's logical channels and their
sizes, and the server a join code lives on. Both sides import it, so the client does not
import the server to learn them.

Pure module: no trio, no clock.
"""

from __future__ import annotations

from echo.channels.core import ChannelSpec
from echo.lobby.protocol import MAX_MESSAGE_BYTES, Channel
from echo.topics.ring import HashRing

#: The largest message on the chat channel, either way: the server's whole chat buffer (a
#: larger SendChat could never be guaranteed there). Declared, it lets a member hand back
#: chat credit once a quarter of its 16 KiB is read instead of after every line: one datagram
#: to the server per chat line delivered was as many as the deliveries themselves.
CHAT_MAX_MESSAGE = 2048
#: A ChatLine's bytes besides its member id and text: type, lobby id, str8 and str16 lengths.
CHAT_LINE_OVERHEAD = 1 + 8 + 1 + 2
#: A member's buffer for the server's replies and for lobby updates: two largest messages.
#: It costs the member memory only while its application does not read.
MEMBER_BUFFER = 2 * MAX_MESSAGE_BYTES


def lobby_channel_specs(*, server: bool) -> list[ChannelSpec]:
    """The lobby's logical channels. Capacities are each side's receive buffers: the server
    takes requests up to the largest message (a recreate carries a whole lobby) and hardly
    anything on the updates channel (members send nothing there); chat holds a few lines, so a
    flood runs out of credit at once. Chat has the lowest priority on the wire, and a bound on
    its messages (`CHAT_MAX_MESSAGE`).

    Every channel declares its largest message, and a member's buffers for replies and
    updates hold two of them (`MEMBER_BUFFER`): a member then hands credit back once a
    quarter of its buffer is read, not after every message (`ChannelSpec.max_message`).
    Without that, each update a member read (a member joined, left, got ready) and each reply
    sent the server a GUARANTEE of its own, with the probe heartbeat after it. The server's
    buffers stay one largest request and one chat line, as they bound what a member can make
    the server hold: the credit a request or a chat line freed goes back in the same session
    message as the reply or the line's echo."""
    if server:
        caps = {
            Channel.REQUESTS: MAX_MESSAGE_BYTES,
            Channel.UPDATES: 1024,
            Channel.CHAT: CHAT_MAX_MESSAGE,
        }
    else:
        caps = {
            Channel.REQUESTS: MEMBER_BUFFER,
            Channel.UPDATES: MEMBER_BUFFER,
            Channel.CHAT: 16 * 1024,
        }
    largest = MAX_MESSAGE_BYTES
    return [
        ChannelSpec(
            Channel.REQUESTS, capacity=caps[Channel.REQUESTS], priority=0, max_message=largest
        ),
        ChannelSpec(
            Channel.UPDATES, capacity=caps[Channel.UPDATES], priority=0, max_message=largest
        ),
        ChannelSpec(
            Channel.CHAT, capacity=caps[Channel.CHAT], priority=1, max_message=CHAT_MAX_MESSAGE
        ),
    ]


def code_home(ring: HashRing, code: str) -> str:
    """The lobby server a join code was made on (codes are chosen to land on their server)."""
    return ring.servers_for(f"code:{code}", 1)[0]


def code_walk(ring: HashRing, code: str, n: int) -> list[str]:
    return ring.servers_for(f"code:{code}", n)
