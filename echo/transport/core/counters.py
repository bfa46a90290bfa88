"""Transport counters: Aeron's system counters are the vocabulary (docs/architecture.md,
Conventions).

One mutable object per transport, shared by the pure state machines, which bump plain int
attributes (cheap on the hot path); `snapshot()` gives a dict for logs, tests and metrics.
The `*_sent` frame counters count datagrams that left the socket (one per destination), never
attempts: a SETUP with no destination yet, or lost to a send error, counts nothing.
"""

from __future__ import annotations

from collections import Counter

FIELDS = (
    "bytes_sent",
    "bytes_received",
    "datagrams_sent",
    "datagrams_received",
    "data_frames_sent",  # datagrams of new data (each copy to each destination)
    "heartbeats_sent",
    "heartbeats_received",
    "setups_sent",
    "setups_received",
    "status_messages_sent",
    "status_messages_received",
    "setup_elicitations_sent",
    # setup-eliciting SMs received (flag 0x80): MDC registrations, a receiver that lost its
    # image, and the periodic session-0 SM of an Aeron receive endpoint with a control address
    "setup_elicitations_received",
    "naks_sent",
    "naks_received",
    "retransmits_sent",
    "retransmitted_bytes",
    "rttm_replies_sent",
    "invalid_frames",
    "flow_control_overruns",
    "flow_control_underruns",
    "duplicate_data",
    "unknown_session_drops",
    "session_filter_drops",
    "images_created",
    "images_closed",
    "images_revoked",  # ended by the publisher's revoke (Aeron 1.48: REVOKED on end-of-stream)
    "destinations_added",
    "destinations_removed",
    "destinations_refused",
    "send_errors",
    "receive_errors",
    "send_would_block",
    "unvalidated_drops",
    "cookie_challenges_sent",
    "cookies_received",
    "rate_limited",
    "amplification_limited",
    "gso_runs_sent",
    "gro_batches_received",
    "gso_disabled",
    "response_setups_sent",
    "response_setups_received",
)


class Counters:
    __slots__ = (*FIELDS, "invalid_by_reason")

    bytes_sent: int
    bytes_received: int
    datagrams_sent: int
    datagrams_received: int
    data_frames_sent: int
    heartbeats_sent: int
    heartbeats_received: int
    setups_sent: int
    setups_received: int
    status_messages_sent: int
    status_messages_received: int
    setup_elicitations_sent: int
    setup_elicitations_received: int
    naks_sent: int
    naks_received: int
    retransmits_sent: int
    retransmitted_bytes: int
    rttm_replies_sent: int
    invalid_frames: int
    flow_control_overruns: int
    flow_control_underruns: int
    duplicate_data: int
    unknown_session_drops: int
    session_filter_drops: int
    images_created: int
    images_closed: int
    images_revoked: int
    destinations_added: int
    destinations_removed: int
    destinations_refused: int
    send_errors: int
    receive_errors: int
    send_would_block: int
    unvalidated_drops: int
    cookie_challenges_sent: int
    cookies_received: int
    rate_limited: int
    amplification_limited: int
    gso_runs_sent: int
    gro_batches_received: int
    gso_disabled: int
    response_setups_sent: int
    response_setups_received: int
    invalid_by_reason: Counter[str]

    def __init__(self) -> None:
        for name in FIELDS:
            setattr(self, name, 0)
        self.invalid_by_reason: Counter[str] = Counter()

    def invalid(self, reason: str) -> None:
        self.invalid_frames += 1
        self.invalid_by_reason[reason] += 1

    def snapshot(self) -> dict[str, int]:
        values: dict[str, int] = {name: getattr(self, name) for name in FIELDS}
        for reason, count in sorted(self.invalid_by_reason.items()):
            values[f"invalid_frames.{reason}"] = count
        return values
