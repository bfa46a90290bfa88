"""Every timer and size of the transport, declared once.

`TransportConfig` is what an application sets; the pure cores read their timers from the two
records derived from it, `SenderTimers` and `ReceiverTimers`, whose defaults are the config's:
a pure sender or receiver built without a config (a unit test, a pure pair) runs on the same
numbers as a transport built with `TransportConfig()`. Timers that only a core knows (the tail
probe delay, the NAK group size) are declared on its record alone.

Pure: imports nothing of trio, reads no clock.
"""

from __future__ import annotations

import attrs

#: a receiver's window when nothing asks for another (pure cores and unit tests; a transport
#: uses `TransportConfig.rcv_wnd`): Aeron's 128 KiB
DEFAULT_RECEIVER_WINDOW = 128 * 1024


@attrs.frozen
class TransportConfig:
    """Every timer and size of the transport, with Aeron's defaults (its driver Configuration)."""

    mtu: int = 1408
    term_length: int = 16 * 1024 * 1024
    rcv_wnd: int = 2 * 1024 * 1024
    setup_interval: float = 0.1
    heartbeat_interval: float = 0.1
    status_message_interval: float = 0.2
    image_liveness_timeout: float = 10.0
    publication_connection_timeout: float = 5.0
    linger: float = 5.0
    nak_delay: float = 0.0001
    nak_retry_ratio: int = 100
    group_nak_max_backoff: float = 0.01
    retransmit_linger: float = 0.01
    #: unicast publications resend a range NAKed again after this (a receiver's retry)
    unicast_retransmit_linger: float = 0.00025
    #: the soonest a unicast receiver NAKs a gap again (it waits for its measured repair time)
    nak_retry_min: float = 0.0005
    #: send one heartbeat a couple of milliseconds after each burst of data (docs/configuration.md)
    probe_after_data: bool = False
    #: retransmits in flight per publication (Aeron: 1 unicast, 16 group; more keep heavy loss
    #: from costing a linger period per gap: one per gap a receiver NAKs, see loss.MAX_GAPS)
    max_retransmits: int = 64
    destination_timeout: float = 5.0
    max_destinations: int = 1024
    #: images (publishers) one subscription endpoint accepts at once; more SETUPs are refused
    max_images: int = 1024
    mdc_registration_interval: float = 1.0
    setup_elicit_interval: float = 0.2
    image_cooldown: float = 10.0
    #: largest term length a SETUP from the network may ask a receiver to allocate
    max_receiver_term_length: int = 64 * 1024 * 1024
    socket_rcvbuf: int = 4 * 1024 * 1024
    socket_sndbuf: int = 4 * 1024 * 1024
    #: on Linux, hand the kernel runs of equal datagrams in one system call (UDP GSO) and
    #: read coalesced ones (UDP GRO); the datagrams on the wire are the same either way
    gso: bool = True
    #: auto-assigned publication session ids avoid [low, high] (Aeron's reserved range)
    reserved_session_low: int = -1
    reserved_session_high: int = 1000
    #: anti-amplification (validation.py): dynamic-MDC destinations must echo a cookie, and
    #: nothing is sent to an unvalidated address beyond the bytes received from it. Turn off
    #: only to serve plain Aeron receivers, which cannot answer the cookie.
    validate_addresses: bool = True
    #: replies to unvalidated sources (cookie challenges) per second and burst, per host
    unvalidated_reply_rate: float = 500.0
    unvalidated_reply_burst: float = 1000.0
    seed: int | None = None

    def sender_timers(self) -> SenderTimers:
        return SenderTimers(
            setup_interval=self.setup_interval,
            heartbeat_interval=self.heartbeat_interval,
            connection_timeout=self.publication_connection_timeout,
            linger=self.linger,
            retransmit_linger=self.retransmit_linger,
            unicast_retransmit_linger=self.unicast_retransmit_linger,
            probe_after_data=self.probe_after_data,
        )

    def receiver_timers(self, nak_delay: float | None = None) -> ReceiverTimers:
        return ReceiverTimers(
            status_message_interval=self.status_message_interval,
            liveness_timeout=self.image_liveness_timeout,
            nak_delay=self.nak_delay if nak_delay is None else nak_delay,
            nak_retry_ratio=self.nak_retry_ratio,
            nak_retry_min=self.nak_retry_min,
            group_nak_max_backoff=self.group_nak_max_backoff,
            setup_elicit_interval=self.setup_elicit_interval,
            mdc_registration_interval=self.mdc_registration_interval,
            cooldown=self.image_cooldown,
        )


#: the defaults, for the pure cores' own keyword defaults (so they are declared only above)
DEFAULTS = TransportConfig()


@attrs.frozen
class SenderTimers:
    """A publication's timers (see `TransportConfig.sender_timers`)."""

    setup_interval: float = DEFAULTS.setup_interval
    heartbeat_interval: float = DEFAULTS.heartbeat_interval
    connection_timeout: float = DEFAULTS.publication_connection_timeout
    linger: float = DEFAULTS.linger
    retransmit_linger: float = DEFAULTS.retransmit_linger
    #: unicast: a NAK is normally a receiver's retry, which waits for its measured repair time
    #: and at least 0.5 ms (ReceiverTimers.nak_retry_min), so duplicates are ignored only briefly
    unicast_retransmit_linger: float = DEFAULTS.unicast_retransmit_linger
    #: after data, while NAKs have been seen in the last second, send a heartbeat this soon
    #: so that a lost tail (the last datagrams before the sender stops) is NAKed quickly
    #: instead of after the 100 ms idle heartbeat
    tail_probe_delay: float = 0.002
    #: also probe after every burst of data (one heartbeat when the stream goes quiet): with a
    #: long idle heartbeat this keeps a lost last message from waiting a whole interval
    probe_after_data: bool = DEFAULTS.probe_after_data


@attrs.frozen
class ReceiverTimers:
    """An image's and a receive endpoint's timers (see `TransportConfig.receiver_timers`)."""

    status_message_interval: float = DEFAULTS.status_message_interval
    liveness_timeout: float = DEFAULTS.image_liveness_timeout
    #: unicast: 100 µs, then retry every nak_delay * nak_retry_ratio (10 ms) until a repair
    #: time has been measured
    nak_delay: float = DEFAULTS.nak_delay
    nak_retry_ratio: int = DEFAULTS.nak_retry_ratio
    #: unicast NAK retries follow the measured repair time (see loss.RepairTimer), but never
    #: sooner than this after the last NAK of a gap (a few loopback repair times: 0.1-0.3 ms)
    nak_retry_min: float = DEFAULTS.nak_retry_min
    group_nak_max_backoff: float = DEFAULTS.group_nak_max_backoff
    #: the group size Aeron's multicast NAK delay generator assumes
    group_size: int = 10
    setup_elicit_interval: float = DEFAULTS.setup_elicit_interval
    mdc_registration_interval: float = DEFAULTS.mdc_registration_interval
    cooldown: float = DEFAULTS.image_cooldown
