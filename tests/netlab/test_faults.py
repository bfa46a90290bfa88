"""Socket errors never end a task (EPERM from a firewall here, in a namespace)."""

from __future__ import annotations

import pytest

from tests.netlab.fixtures import nat_lab_factory  # noqa: F401  (fixture)
from tests.netlab.lab import NatLabFactory
from tests.netlab.test_mdc_nat import result, start

pytestmark = pytest.mark.netns


def test_eperm_from_an_output_firewall_is_counted_and_the_transport_recovers(
    nat_lab_factory: NatLabFactory,  # noqa: F811
) -> None:
    lab = nat_lab_factory(sites=1, clients_per_site=1)
    outcome = result(start(lab.sites[0].clients[0], "eperm", "--channel", "-", "--port", "24050"))
    assert outcome["send_errors_while_blocked"] > 0  # SETUPs hit EPERM, counted
    assert outcome["connected_while_blocked"] is False
    assert outcome["received_after"] == "after the firewall"
