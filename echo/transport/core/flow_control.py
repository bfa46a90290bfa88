"""Sender flow control: how status messages move a publication's sender limit (Aeron's FlowControl).

Unicast publications use `UnicastFlowControl`. Multi-destination publications use one of the
multicast strategies of Aeron ("Flow Control in Aeron"): `max` (fastest receiver wins; the default),
`min` (slowest receiver wins) and `tagged` (slowest receiver among those whose SMs carry the group
tag). `min` and `tagged` also know a minimum group size, which gates `is_connected`, and drop a
receiver that has sent no SM for the receiver timeout.
"""

from __future__ import annotations

import attrs

from echo.transport.core.frames import StatusMessage
from echo.transport.core.uri import FlowControlSpec

FLOW_CONTROL_RECEIVER_TIMEOUT = 5.0


class FlowControl:
    """What every strategy does (a base class, not a Protocol: compiled, a publication then
    calls its strategy directly, as it does on every offer)."""

    #: how many receiver windows a retransmit may cover (Aeron's RetransmitHandler)
    retransmit_window_multiple = 16

    def on_status_message(
        self, sm: StatusMessage, sm_position: int, sender_limit: int, now: float
    ) -> int:
        raise NotImplementedError

    def on_idle(self, now: float, sender_limit: int) -> int:
        return sender_limit

    def has_required_receivers(self) -> bool:
        return True


class UnicastFlowControl(FlowControl):
    retransmit_window_multiple = 16

    def on_status_message(
        self, sm: StatusMessage, sm_position: int, sender_limit: int, now: float
    ) -> int:
        return max(sender_limit, sm_position + sm.receiver_window)


class MaxMulticastFlowControl(UnicastFlowControl):
    retransmit_window_multiple = 4


@attrs.define
class _Receiver:
    receiver_id: int
    position_plus_window: int
    last_sm: float


class MinMulticastFlowControl(FlowControl):
    """Limit = the slowest live receiver's position + window (AbstractMinMulticastFlowControl).

    With `group_tag` set this is the `tagged` strategy: only SMs carrying that tag count.
    """

    retransmit_window_multiple = 16

    def __init__(
        self,
        *,
        group_tag: int | None = None,
        group_min_size: int = 0,
        receiver_timeout: float = FLOW_CONTROL_RECEIVER_TIMEOUT,
    ) -> None:
        self.group_tag = group_tag
        self.group_min_size = group_min_size
        self.receiver_timeout = receiver_timeout
        self.receivers: dict[int, _Receiver] = {}

    def _matches(self, sm: StatusMessage) -> bool:
        return self.group_tag is None or sm.group_tag == self.group_tag

    def _limit(self, sender_limit: int) -> int:
        if not self.receivers or len(self.receivers) < self.group_min_size:
            # Not enough of the group is here yet: hold the limit where it is.
            return sender_limit
        return min(r.position_plus_window for r in self.receivers.values())

    def on_status_message(
        self, sm: StatusMessage, sm_position: int, sender_limit: int, now: float
    ) -> int:
        if not self._matches(sm):
            return sender_limit
        if sm.is_end_of_stream:
            self.receivers.pop(sm.receiver_id, None)
            return self._limit(sender_limit)
        position_plus_window = sm_position + sm.receiver_window
        receiver = self.receivers.get(sm.receiver_id)
        if receiver is None:
            self.receivers[sm.receiver_id] = _Receiver(sm.receiver_id, position_plus_window, now)
        else:
            receiver.position_plus_window = max(
                receiver.position_plus_window, position_plus_window
            )
            receiver.last_sm = now
        return self._limit(sender_limit)

    def on_idle(self, now: float, sender_limit: int) -> int:
        # Build a new dict rather than deleting while swapping indices: Aeron's own in-place
        # removal once dropped a live receiver that sat between two idle ones (PR #2144).
        deadline = now - self.receiver_timeout
        if any(r.last_sm < deadline for r in self.receivers.values()):
            self.receivers = {rid: r for rid, r in self.receivers.items() if r.last_sm >= deadline}
        return self._limit(sender_limit)

    def has_required_receivers(self) -> bool:
        return len(self.receivers) >= self.group_min_size


def make_flow_control(spec: FlowControlSpec | None, *, multi_destination: bool) -> FlowControl:
    if not multi_destination:
        if spec is not None:
            raise ValueError(f"unsupported unicast flow control strategy: fc={spec.strategy}")
        return UnicastFlowControl()
    if spec is None or spec.strategy == "max":
        return MaxMulticastFlowControl()
    timeout = spec.receiver_timeout or FLOW_CONTROL_RECEIVER_TIMEOUT
    if spec.strategy == "min":
        return MinMulticastFlowControl(group_min_size=spec.group_min_size, receiver_timeout=timeout)
    if spec.strategy == "tagged":
        if spec.group_tag is None:
            raise ValueError("fc=tagged needs a group tag, e.g. fc=tagged,g:1001")
        return MinMulticastFlowControl(
            group_tag=spec.group_tag,
            group_min_size=spec.group_min_size,
            receiver_timeout=timeout,
        )
    raise ValueError(f"unknown flow control strategy: fc={spec.strategy}")
