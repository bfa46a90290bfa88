"""What this machine's Wireshark makes of the response-channel frames (Aeron 1.48).

echo encodes RSP_SETUP (type 0x0B) and the SETUP flag 0x80 (send-response-setup) byte for byte
as Aeron 1.48 defines them (tests/transport/test_frames.py). Wireshark's Aeron dissector is
older than response channels in the version Debian 12 ships (4.0.17): it knows frame types 0-6
and extensions, so it decodes the SETUP (its flags byte shown as 0x80, unnamed) and decodes no
frame in an RSP_SETUP datagram (its bytes stay undissected data). This test checks exactly
that, or, with a dissector that lists type 11, that it takes the RSP_SETUP for Aeron.
"""

from __future__ import annotations

import struct
import subprocess
from pathlib import Path

from echo.transport.core.frames import SETUP_SEND_RESPONSE_FLAG, ResponseSetup, Setup
from tests.wire.capture import tshark_decode

PORTS = (40000, 40001)
LINKTYPE_RAW = 101  # raw IPv4, no link-layer header


def _ipv4_udp(payload: bytes) -> bytes:
    udp = struct.pack("!HHHH", PORTS[0], PORTS[1], 8 + len(payload), 0) + payload
    header = struct.pack(
        "!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 1, 0, 64, 17, 0, b"\x7f\0\0\1", b"\x7f\0\0\1"
    )
    total = sum(struct.unpack("!10H", header))
    total = (total & 0xFFFF) + (total >> 16)
    checksum = ~((total & 0xFFFF) + (total >> 16)) & 0xFFFF
    return header[:10] + struct.pack("!H", checksum) + header[12:] + udp


def _write_pcap(path: Path, payloads: list[bytes]) -> None:
    out = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, LINKTYPE_RAW)
    for index, payload in enumerate(payloads):
        packet = _ipv4_udp(payload)
        out += struct.pack("<IIII", 1_700_000_000 + index, 0, len(packet), len(packet)) + packet
    path.write_bytes(out)


def _dissector_knows_rsp_setup() -> bool:
    values = subprocess.run(
        ["tshark", "-G", "values"], capture_output=True, text=True, check=True
    ).stdout
    return any(line.split("\t")[1:3] == ["aeron.setup.type", "11"] for line in values.splitlines())


def test_the_dissector_reads_response_channel_frames_as_far_as_it_knows_them(
    tmp_path: Path,
) -> None:
    setup = Setup(
        term_offset=0,
        session_id=0x12345678,
        stream_id=1001,
        initial_term_id=10,
        active_term_id=11,
        term_length=65536,
        mtu=1408,
        flags=SETUP_SEND_RESPONSE_FLAG,
    )
    response = ResponseSetup(session_id=0x12345678, stream_id=1001, response_session_id=-2)
    pcap = tmp_path / "response.pcap"
    _write_pcap(pcap, [setup.encode(), response.encode()])
    first, second = tshark_decode(pcap, PORTS, tmp_path / "response.pdml")

    (decoded,) = first.frames
    assert decoded.kind == "SETUP" and not first.malformed
    assert decoded["flags"] == 0x80
    assert (decoded["session_id"], decoded["stream_id"]) == (0x12345678, 1001)
    assert (decoded["initial_term_id"], decoded["active_term_id"]) == (10, 11)
    assert (decoded["term_length"], decoded["mtu"]) == (65536, 1408)

    if _dissector_knows_rsp_setup():
        assert "aeron" in second.protocols and not second.malformed
        assert second.payload_length == 20
    else:
        # Wireshark 4.0 (Debian 12): with the port decoded as Aeron the dissector claims the
        # datagram but decodes no frame of type 0x0B (its 20 bytes stay undissected data): it
        # is neither mistaken for another frame nor flagged malformed.
        assert not second.frames and not second.malformed
        assert second.payload_length == 20
