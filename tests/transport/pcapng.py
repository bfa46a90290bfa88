"""A tiny pcapng reader for the reference Aeron captures (no dependencies).

Reads Section Header, Interface Description and Enhanced Packet blocks (pcapng spec,
draft-ietf-opsawg-pcapng); other block types are skipped. Each packet is Ethernet + IPv4 + UDP,
so the Aeron bytes start at offset 42 (tests/data/aeron-captures/README.md).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import attrs

SECTION_HEADER_BLOCK = 0x0A0D0D0A
INTERFACE_DESCRIPTION_BLOCK = 0x00000001
ENHANCED_PACKET_BLOCK = 0x00000006
BYTE_ORDER_MAGIC = 0x1A2B3C4D
OPT_END_OF_OPT = 0
OPT_COMMENT = 1
IF_TSRESOL = 9
LINKTYPE_ETHERNET = 1
ETHERNET_HEADER_LENGTH = 14
IPV4_HEADER_LENGTH = 20
UDP_HEADER_LENGTH = 8
AERON_OFFSET = ETHERNET_HEADER_LENGTH + IPV4_HEADER_LENGTH + UDP_HEADER_LENGTH
ETHERTYPE_IPV4 = 0x0800
IPPROTO_UDP = 17

CAPTURE_NAMES = ("unicast", "mdc-dynamic", "loss-nak", "fragmented", "gtag-rttm")


class PcapngError(ValueError):
    pass


@attrs.frozen
class Record:
    """One captured UDP datagram. `frame` is the 1-based capture frame number (as in NAME.txt)."""

    frame: int
    timestamp: float
    src_port: int
    dst_port: int
    payload: bytes
    comment: str | None


def captures_dir() -> Path:
    """tests/data/aeron-captures, in the repository (its README says how they were made).
    Fails loudly: the captures are the codecs' test vectors."""
    path = Path(__file__).resolve().parents[1] / "data" / "aeron-captures"
    if not path.is_dir():
        raise FileNotFoundError(f"Aeron reference captures not found at {path}")
    return path


def capture_path(name: str) -> Path:
    path = captures_dir() / f"{name}.pcapng"
    if not path.is_file():
        raise FileNotFoundError(f"Aeron reference capture missing: {path}")
    return path


def _options(body: bytes, start: int, endian: str) -> Iterator[tuple[int, bytes]]:
    offset = start
    while offset + 4 <= len(body):
        code, length = struct.unpack_from(endian + "HH", body, offset)
        offset += 4
        if code == OPT_END_OF_OPT:
            return
        yield code, body[offset : offset + length]
        offset += (length + 3) & ~3


def _resolution(value: int) -> float:
    # if_tsresol: MSB clear => 10^-v seconds, set => 2^-v (pcapng §4.2).
    if value & 0x80:
        return float(2.0 ** -(value & 0x7F))
    return float(10.0**-value)


def read_records(path: Path) -> list[Record]:
    """Every UDP datagram in a pcapng file, in capture order."""
    data = path.read_bytes()
    records: list[Record] = []
    endian = "<"
    resolutions: list[float] = []
    offset = 0
    while offset < len(data):
        if offset + 12 > len(data):
            raise PcapngError(f"{path.name}: truncated block at {offset}")
        block_type = struct.unpack_from("<I", data, offset)[0]
        if block_type == SECTION_HEADER_BLOCK:
            magic = struct.unpack_from("<I", data, offset + 8)[0]
            if magic == BYTE_ORDER_MAGIC:
                endian = "<"
            elif magic == struct.unpack(">I", struct.pack("<I", BYTE_ORDER_MAGIC))[0]:
                endian = ">"
            else:
                raise PcapngError(f"{path.name}: bad byte-order magic {magic:#x}")
            resolutions = []
        block_type, total_length = struct.unpack_from(endian + "II", data, offset)
        if total_length < 12 or total_length % 4 or offset + total_length > len(data):
            raise PcapngError(f"{path.name}: bad block length {total_length} at {offset}")
        trailer = struct.unpack_from(endian + "I", data, offset + total_length - 4)[0]
        if trailer != total_length:
            raise PcapngError(f"{path.name}: block length trailer mismatch at {offset}")
        body = data[offset + 8 : offset + total_length - 4]
        if block_type == INTERFACE_DESCRIPTION_BLOCK:
            link_type = struct.unpack_from(endian + "H", body, 0)[0]
            if link_type != LINKTYPE_ETHERNET:
                raise PcapngError(f"{path.name}: link type {link_type}, expected Ethernet")
            resolution = 1e-6
            for code, value in _options(body, 8, endian):
                if code == IF_TSRESOL:
                    resolution = _resolution(value[0])
            resolutions.append(resolution)
        elif block_type == ENHANCED_PACKET_BLOCK:
            interface, ts_high, ts_low, captured, _original = struct.unpack_from(
                endian + "IIIII", body, 0
            )
            packet = body[20 : 20 + captured]
            comment = None
            for code, value in _options(body, 20 + ((captured + 3) & ~3), endian):
                if code == OPT_COMMENT:
                    comment = value.decode("utf-8")
            timestamp = ((ts_high << 32) | ts_low) * resolutions[interface]
            records.append(_udp_record(path, len(records) + 1, timestamp, packet, comment))
        offset += total_length
    return records


def _udp_record(
    path: Path, frame: int, timestamp: float, packet: bytes, comment: str | None
) -> Record:
    if len(packet) < AERON_OFFSET:
        raise PcapngError(f"{path.name} frame {frame}: {len(packet)} bytes, not Ethernet/IPv4/UDP")
    ethertype = struct.unpack_from(">H", packet, 12)[0]
    version_ihl = packet[ETHERNET_HEADER_LENGTH]
    protocol = packet[ETHERNET_HEADER_LENGTH + 9]
    if ethertype != ETHERTYPE_IPV4 or version_ihl != 0x45 or protocol != IPPROTO_UDP:
        raise PcapngError(f"{path.name} frame {frame}: not IPv4 (no options) + UDP")
    udp = ETHERNET_HEADER_LENGTH + IPV4_HEADER_LENGTH
    src_port, dst_port, udp_length = struct.unpack_from(">HHH", packet, udp)
    payload = packet[AERON_OFFSET : udp + udp_length]
    if len(payload) != udp_length - UDP_HEADER_LENGTH:
        raise PcapngError(f"{path.name} frame {frame}: truncated UDP payload")
    return Record(frame, timestamp, src_port, dst_port, payload, comment)


def read_capture(name: str) -> list[Record]:
    return read_records(capture_path(name))
