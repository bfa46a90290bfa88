"""echo.channels: logical channels with buffer guarantees, and data handles.

The design is the resource-management note ("Resource Management": logical communication
channels over one physical channel).

Many independent, bounded message buffers over one reliable ordered session, so that a slow kind
of message never stalls a cheap one and no peer can overrun the other's memory. The receiver
promises buffer space (guarantees), the sender spends it; optimistic messages beyond it may be
dropped, and the library then apologises and retransmits them, in order, by itself.

    from echo.channels import ChannelSpec, open_channels

    SPECS = [ChannelSpec(0, capacity=4096, priority=0),            # control: small, urgent
             ChannelSpec(1, capacity=1 << 20, priority=1),         # bulk
             ChannelSpec(2, capacity=16 * 1024, handles=True)]     # handle type 2: binds

    async with open_channels(session, SPECS) as channels:   # same specs on both peers
        await channels[1].send(blob)                    # returns once it will surely be buffered
        await channels[0].send(b"ping", optimistic=True)  # at once; resent if dropped
        handle = await channels.bind(2, b"a big shared value")
        await channels[0].send(b"use", refs=[HandleRef(2, handle, sender_created=True)])
        async for message in channels[0]:   # message.data, message.refs; the previous message
            ...                             # counts as processed (its space freed) at the next
        channels[1].resize(64 * 1024)       # our receive buffer for channel 1
        channels[1].limit_sending(0)        # we will send nothing more: the peer's loop ends
        channels.free(2, handle)            # three-step FreeHandle, handled for you

`session` is anything with `async send(bytes)`, `async receive() -> bytes` and
`async close(reason)` (echo.session.Session). A protocol violation by the peer closes the session
with a reason; operations then raise ChannelsClosed. The pure state machine is
`echo.channels.core.ChannelPeer` (no trio, no clock); the wire codec is `echo.channels.wire`.
"""

from echo.channels.api import Channel, Channels, ChannelsClosed, SessionLike, open_channels
from echo.channels.core import (
    ChannelClosedError,
    ChannelPeer,
    ChannelSpec,
    ChannelUsageError,
    Delivery,
    OutState,
)
from echo.channels.wire import HandleRef, WireError

__all__ = [
    "Channel",
    "ChannelClosedError",
    "ChannelPeer",
    "ChannelSpec",
    "ChannelUsageError",
    "Channels",
    "ChannelsClosed",
    "Delivery",
    "HandleRef",
    "OutState",
    "SessionLike",
    "WireError",
    "open_channels",
]
