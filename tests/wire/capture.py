"""Capture an Echo 2.0 exchange with tshark and check it with Wireshark's own Aeron dissector.

    sudo .venv/bin/python -m tests.wire.capture [--keep DIR] [--count 150] [--loss 0.1]

Steps (needs root, `ip`, `nft` and `tshark`):

1. a fresh network namespace with only `lo` up, so the capture holds nothing but echo's traffic;
2. `tshark -i lo -f udp -w exchange.pcapng` inside it;
3. `tests.wire.exchange --loss-mode nft` inside it: an Echo 2.0 server and client with kernel
   loss (nftables, input hook: after the capture point) once the duologue echoes,
   fragmentation and term rotation (see that module); it writes what its transports recorded
   to record.json;
4. tshark stopped, then the capture decoded twice by tshark: `-d udp.port==20100-20199,aeron`
   (with the dissector's sequence/stream analysis and reassembly on) as PDML, and once with
   the dissector's own heuristic (`--enable-heuristic aeron_udp`) as a second opinion;
5. `check()`: every datagram is Aeron, none malformed, no expert warning or error, every frame
   type present, and what the dissector read agrees with the transports' counters and records.

With `--keep DIR` the pcapng, PDML and record stay in DIR: open the pcapng in Wireshark and use
Decode As... UDP port 20100-20199 -> Aeron (or enable the aeron_udp heuristic).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import attrs

REPO = Path(__file__).resolve().parents[2]
U32 = 2**32
ALIGN = 32
# Wireshark's expert severities (epan/proto.h, PI_SEVERITY_MASK values).
SEVERITY_CHAT = 0x00200000
SEVERITY_NOTE = 0x00400000
SEVERITY_WARN = 0x00600000
SEVERITY_ERROR = 0x00800000
SEVERITY_NAMES = {
    SEVERITY_CHAT: "chat",
    SEVERITY_NOTE: "note",
    SEVERITY_WARN: "warning",
    SEVERITY_ERROR: "error",
}
#: Aeron SM flags (StatusMessageFlyweight) and echo's cookie flag
#: (echo/transport/core/validation.py).
SM_SETUP_FLAG = 0x80
SM_EOS_FLAG = 0x40
SM_COOKIE_FLAG = 0x20
#: Frame kinds the capture must hold.
REQUIRED_KINDS = ("SETUP", "DATA", "SM", "SM(setup)", "NAK", "HEARTBEAT", "PAD")
DISSECTOR_PREFS = (
    "aeron.sequence_analysis:TRUE",
    "aeron.stream_analysis:TRUE",
    "aeron.reassemble_fragments:TRUE",
)


class CaptureError(RuntimeError):
    """The capture could not be made (no root, no tshark, tshark or the exchange failed)."""


# ------------------------------------------------------------------------------------ decoding


@attrs.frozen
class Frame:
    """One Aeron frame as the dissector decoded it (ids as it shows them: unsigned 32-bit)."""

    packet: int
    kind: str  # SETUP DATA HEARTBEAT PAD SM NAK RTTM ERR
    src_port: int
    dst_port: int
    fields: dict[str, int]
    #: bytes the dissector says the frame spans in the datagram
    size: int
    #: the dissector's own name for it (aeron.data, aeron.heartbeat...)
    shown_as: str = ""

    def __getitem__(self, name: str) -> int:
        return self.fields[name]

    @property
    def wire_length(self) -> int:
        """Bytes this frame takes in the datagram, by the Aeron layout."""
        if self.kind == "DATA":
            return align(self["frame_length"])
        if self.kind in ("PAD", "HEARTBEAT"):
            # Only a PAD's 32-byte header travels; a heartbeat is a 32-byte DATA header.
            return 32
        return self["frame_length"]

    @property
    def term_span(self) -> int:
        """Bytes of term space the frame covers (a PAD covers the rest of its term)."""
        if self.kind in ("DATA", "PAD"):
            return align(self["frame_length"])
        return 0


@attrs.frozen
class Datagram:
    number: int
    src_port: int
    dst_port: int
    payload_length: int
    protocols: tuple[str, ...]
    frames: tuple[Frame, ...]
    experts: tuple[tuple[int, str], ...]  # (severity, message)
    malformed: bool


def align(length: int) -> int:
    return (length + ALIGN - 1) & ~(ALIGN - 1)


_KINDS = {
    "aeron.setup": "SETUP",
    "aeron.data": "DATA",
    "aeron.heartbeat": "HEARTBEAT",
    "aeron.pad": "PAD",
    "aeron.sm": "SM",
    "aeron.nak": "NAK",
    "aeron.rtt": "RTTM",
    "aeron.err": "ERR",
}


def _int(text: str | None) -> int:
    if text is None:
        return 0
    return int(text, 0)


def _walk(element: ET.Element) -> Iterator[ET.Element]:
    yield element
    for child in element:
        yield from _walk(child)


def parse_pdml(path: Path) -> list[Datagram]:
    """Read `tshark -T pdml` output into datagrams and their Aeron frames."""
    datagrams: list[Datagram] = []
    for _, packet in ET.iterparse(path, events=("end",)):
        if packet.tag != "packet":
            continue
        protos = {proto.get("name", ""): proto for proto in packet.findall("proto")}
        num = protos["geninfo"].find("field[@name='num']")
        number = _int(None if num is None else num.get("show"))
        udp = protos.get("udp")
        fields: dict[str, str] = {}
        if udp is not None:
            for field in udp:
                fields.setdefault(field.get("name", ""), field.get("show", ""))
        src_port = _int(fields.get("udp.srcport"))
        dst_port = _int(fields.get("udp.dstport"))
        payload_length = _int(fields.get("udp.length")) - 8
        frames: list[Frame] = []
        aeron = protos.get("aeron")
        if aeron is not None:
            for element in aeron:
                kind = _KINDS.get(element.get("name", ""))
                if kind is None:
                    continue
                prefix = element.get("name", "") + "."
                values: dict[str, int] = {}
                for child in element:
                    name = child.get("name", "")
                    show = child.get("show") or ""
                    if name.startswith(prefix) and name.count(".") == 2 and show:
                        try:
                            values[name[len(prefix) :]] = int(show, 0)
                        except ValueError:
                            continue  # a label (reassembly, analysis), not a header field
                if kind == "DATA" and values.get("frame_length") == 0:
                    # Wireshark 4.0 names only a 0xC0 heartbeat "Heartbeat Frame"; an
                    # end-of-stream heartbeat (0xE0) it shows as a 0-length "Data Frame", the
                    # same for the Aeron C driver's in the reference captures. It is a heartbeat.
                    kind = "HEARTBEAT"
                frames.append(
                    Frame(
                        packet=number,
                        kind=kind,
                        src_port=src_port,
                        dst_port=dst_port,
                        fields=values,
                        size=_int(element.get("size")),
                        shown_as=element.get("name", ""),
                    )
                )
        experts: list[tuple[int, str]] = []
        for element in _walk(packet):
            if element.get("name") == "_ws.expert":
                severity = message = None
                for child in element:
                    if child.get("name") == "_ws.expert.severity":
                        severity = _int(child.get("show"))
                    elif child.get("name") == "_ws.expert.message":
                        message = child.get("show")
                experts.append((severity or 0, message or ""))
        malformed = "_ws.malformed" in protos or any(
            (element.get("name") or "").startswith("_ws.malformed") for element in _walk(packet)
        )
        datagrams.append(
            Datagram(
                number=number,
                src_port=src_port,
                dst_port=dst_port,
                payload_length=payload_length,
                protocols=tuple(protos),
                frames=tuple(frames),
                experts=tuple(experts),
                malformed=malformed,
            )
        )
        packet.clear()
    return datagrams


def tshark_decode(pcap: Path, ports: tuple[int, int], pdml: Path) -> list[Datagram]:
    """Decode `pcap` with the Aeron dissector on every port of `ports` (inclusive)."""
    argv = ["tshark", "-r", str(pcap), "-d", f"udp.port=={ports[0]}-{ports[1]},aeron"]
    for pref in DISSECTOR_PREFS:
        argv += ["-o", pref]
    with pdml.open("wb") as out:
        subprocess.run([*argv, "-T", "pdml"], stdout=out, stderr=subprocess.PIPE, check=True)
    return parse_pdml(pdml)


def tshark_heuristic_protocols(pcap: Path) -> list[str]:
    """`frame.protocols` of each packet when only the dissector's own heuristic is on."""
    proc = subprocess.run(
        [
            "tshark",
            "-r",
            str(pcap),
            "--enable-heuristic",
            "aeron_udp",
            "-T",
            "fields",
            "-e",
            "frame.protocols",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return proc.stdout.splitlines()


# ------------------------------------------------------------------------------------ checking


def frame_kind_counts(datagrams: Iterable[Datagram]) -> collections.Counter[str]:
    """How many frames of each kind; SMs are also split by flag (setup, EOS, cookie)."""
    counts: collections.Counter[str] = collections.Counter()
    for datagram in datagrams:
        for frame in datagram.frames:
            counts[frame.kind] += 1
            if frame.kind == "SM":
                flags = frame["flags"]
                if flags & SM_SETUP_FLAG:
                    counts["SM(setup)"] += 1
                if flags & SM_EOS_FLAG:
                    counts["SM(eos)"] += 1
                if flags & SM_COOKIE_FLAG:
                    counts["SM(cookie)"] += 1
            if frame.kind == "DATA":
                flags = frame["flags"]
                if flags & 0xC0 != 0xC0:
                    counts["DATA(fragment)"] += 1
            if frame.kind == "HEARTBEAT" and frame["flags"] & 0x20:
                counts["HEARTBEAT(eos)"] += 1
    return counts


def _u32(value: int) -> int:
    return value % U32


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


@attrs.define
class Report:
    datagrams: int
    counts: collections.Counter[str]
    retransmitted_frames: int
    problems: list[str]
    notes: list[str]

    def summary(self) -> str:
        lines = [f"datagrams: {self.datagrams}", "frames:"]
        for kind, count in sorted(self.counts.items()):
            lines.append(f"  {kind:16} {count}")
        lines.append(f"retransmitted DATA/PAD frames: {self.retransmitted_frames}")
        lines += [f"note: {note}" for note in self.notes]
        lines += [f"PROBLEM: {problem}" for problem in self.problems] or ["all checks passed"]
        return "\n".join(lines)


def check(
    datagrams: list[Datagram], record: dict[str, Any], heuristic: list[str] | None = None
) -> Report:
    """Everything asked of the capture; each failed expectation is one problem line."""
    problems: list[str] = []
    notes: list[str] = []
    low, high = record["ports"]
    transports = record["transports"]

    def total(counter: str) -> int:
        return sum(t["counters"].get(counter, 0) for t in transports)

    # -- every datagram is Aeron, whole, not malformed, no expert warning/error
    for d in datagrams:
        where = f"datagram {d.number} ({d.src_port}>{d.dst_port})"
        if not (low <= d.src_port <= high or low <= d.dst_port <= high):
            problems.append(f"{where}: neither port is in the exchange's range {low}-{high}")
        if "aeron" not in d.protocols or not d.frames:
            problems.append(f"{where}: not decoded as Aeron (protocols {d.protocols})")
        if d.malformed:
            problems.append(f"{where}: marked malformed")
        for severity, message in d.experts:
            if severity >= SEVERITY_WARN:
                name = SEVERITY_NAMES.get(severity, hex(severity))
                problems.append(f"{where}: expert {name}: {message}")
        covered = sum(frame.wire_length for frame in d.frames)
        if covered != d.payload_length:
            problems.append(
                f"{where}: Aeron frames cover {covered} bytes of a {d.payload_length}-byte payload"
            )
        for frame in d.frames:
            # The dissector shows a heartbeat as 24 bytes (no reserved value); 32 travel, as
            # from the Aeron C driver in the reference captures.
            expected = 24 if frame.shown_as == "aeron.heartbeat" else frame.wire_length
            if frame.size != expected:
                problems.append(
                    f"{where}: dissector spans {frame.size} bytes of a {frame.kind}, "
                    f"expected {expected}"
                )
            if frame.fields.get("version", 0) != 0:
                problems.append(f"{where}: {frame.kind} version {frame['version']}")
    if heuristic is not None:
        if len(heuristic) != len(datagrams):
            problems.append(f"heuristic decode saw {len(heuristic)} packets, not {len(datagrams)}")
        not_aeron = [i + 1 for i, protos in enumerate(heuristic) if ":aeron" not in protos]
        if not_aeron:
            problems.append(f"the aeron_udp heuristic rejects packets {not_aeron[:20]}")

    counts = frame_kind_counts(datagrams)
    for kind in REQUIRED_KINDS:
        if not counts[kind]:
            problems.append(f"no {kind} frame in the capture")

    # -- the capture is exactly what the transports sent
    def same(what: str, captured: int, recorded: int) -> None:
        if captured != recorded:
            problems.append(f"{what}: capture has {captured}, transports recorded {recorded}")

    same("datagrams", len(datagrams), total("datagrams_sent"))
    same("UDP payload bytes", sum(d.payload_length for d in datagrams), total("bytes_sent"))
    same("send errors", 0, total("send_errors"))
    same("NAK frames", counts["NAK"], total("naks_sent"))
    same(
        "SM frames",
        counts["SM"],
        total("status_messages_sent")
        + total("setup_elicitations_sent")
        + total("cookie_challenges_sent"),
    )
    same("setup-eliciting SMs", counts["SM(setup)"], total("setup_elicitations_sent"))
    same("cookie-challenge SMs", counts["SM(cookie)"], total("cookie_challenges_sent"))
    same("RTTM frames", counts["RTTM"], total("rttm_replies_sent"))
    # Every frame counter counts datagrams that left, one per destination: a dynamic-MDC
    # publication's SETUP with no destination registered yet went nowhere and counts nothing.
    same("SETUP frames", counts["SETUP"], total("setups_sent"))
    same("heartbeat frames", counts["HEARTBEAT"], total("heartbeats_sent"))

    # -- sessions, streams, terms and offsets against each publication's own record
    publications = record["publications"]
    by_stream = {(_port(p["local_address"]), _u32(p["session_id"])): p for p in publications}
    sent_frames = [
        f for d in datagrams for f in d.frames if f.kind in ("SETUP", "DATA", "PAD", "HEARTBEAT")
    ]
    for frame in sent_frames:
        pub = by_stream.get((frame.src_port, frame["session_id"]))
        if pub is None:
            problems.append(
                f"datagram {frame.packet}: {frame.kind} of session {frame['session_id']} from "
                f"port {frame.src_port}, which no publication of the exchange has"
            )
    seen: dict[tuple[int, int, int, int, int], int] = {}
    retransmitted: list[Frame] = []
    retransmitted_span = 0
    naks: list[Frame] = []
    for d in datagrams:
        for frame in d.frames:
            if frame.kind == "NAK":
                naks.append(frame)
            if frame.kind not in ("DATA", "PAD"):
                continue
            key = (
                frame.dst_port,
                frame["session_id"],
                frame["stream_id"],
                frame["term_id"],
                frame["term_offset"],
            )
            if key in seen:
                retransmitted.append(frame)
                retransmitted_span += frame.term_span
                # Only ever resent after a NAK for it, from the same image's receiver.
                if not any(
                    nak.packet < frame.packet
                    and nak.src_port == frame.dst_port
                    and nak["session_id"] == frame["session_id"]
                    and nak["stream_id"] == frame["stream_id"]
                    and nak["term_id"] == frame["term_id"]
                    and nak["term_offset"]
                    <= frame["term_offset"]
                    < nak["term_offset"] + nak["length"]
                    for nak in naks
                ):
                    problems.append(
                        f"datagram {frame.packet}: {frame.kind} at term {frame['term_id']} "
                        f"offset {frame['term_offset']} resent with no NAK asking for it"
                    )
            else:
                seen[key] = frame.packet
    same("retransmitted bytes", retransmitted_span, total("retransmitted_bytes"))
    retransmit_datagrams = len({frame.packet for frame in retransmitted})
    data_datagrams = sum(1 for d in datagrams if d.frames and d.frames[0].kind in ("DATA", "PAD"))
    same("datagrams of new data", data_datagrams - retransmit_datagrams, total("data_frames_sent"))
    if retransmit_datagrams < total("retransmits_sent"):
        problems.append(
            f"{retransmit_datagrams} datagrams hold retransmits, fewer than the "
            f"{total('retransmits_sent')} retransmits counted"
        )

    rotated = False
    for pub in publications:
        session = _u32(pub["session_id"])
        port = _port(pub["local_address"])
        name = f"{pub['role']} publication {pub['channel']} (session {pub['session_id']})"
        term_length = pub["term_length"]
        initial = pub["initial_term_id"]
        mine = [f for f in sent_frames if f.src_port == port and f["session_id"] == session]
        if not mine:
            problems.append(f"{name}: not one frame in the capture")
            continue
        for frame in mine:
            if frame["stream_id"] != _u32(pub["stream_id"]):
                problems.append(f"{name}: datagram {frame.packet} has stream {frame['stream_id']}")
        setups = [f for f in mine if f.kind == "SETUP"]
        if not setups:
            problems.append(f"{name}: no SETUP")
        for setup in setups:
            for field, want in (
                ("initial_term_id", _u32(initial)),
                ("term_length", term_length),
                ("mtu", pub["mtu"]),
            ):
                if setup[field] != want:
                    problems.append(
                        f"{name}: SETUP {setup.packet} {field} {setup[field]}, recorded {want}"
                    )
        end = 0
        terms: set[int] = set()
        for frame in mine:
            term_id = frame["active_term_id"] if frame.kind == "SETUP" else frame["term_id"]
            index = (term_id - _u32(initial)) % U32
            if index > pub["position"] // term_length:
                problems.append(
                    f"{name}: datagram {frame.packet} {frame.kind} in term {term_id}, beyond "
                    f"the final position {pub['position']}"
                )
                continue
            offset = frame["term_offset"]
            if offset % ALIGN or offset + frame.term_span > term_length:
                problems.append(
                    f"{name}: datagram {frame.packet} {frame.kind} at bad term offset {offset}"
                )
            if frame.kind in ("DATA", "PAD"):
                terms.add(term_id)
                end = max(end, index * term_length + offset + frame.term_span)
            if frame.kind == "HEARTBEAT":
                end = max(end, index * term_length + offset)
        same(f"{name}: final position", end, pub["position"])
        if len(terms) > 1:
            rotated = True
        for frame in mine:
            if frame.kind == "PAD" and frame["term_offset"] + frame["frame_length"] != term_length:
                problems.append(f"{name}: PAD {frame.packet} does not end its term")
    if not rotated:
        problems.append("no publication's DATA spans more than one term (no term rotation)")
    for nak in naks:
        pub = next(
            (
                p
                for p in publications
                if _port(p["local_address"]) == nak.dst_port
                and _u32(p["session_id"]) == nak["session_id"]
            ),
            None,
        )
        if pub is None:
            problems.append(f"datagram {nak.packet}: NAK to a publication the exchange lacks")
            continue
        index = (nak["term_id"] - _u32(pub["initial_term_id"])) % U32
        start = index * pub["term_length"] + nak["term_offset"]
        if nak["length"] <= 0 or start + nak["length"] > pub["position"]:
            problems.append(f"datagram {nak.packet}: NAK beyond what was published")

    # -- the Echo 2.0 exchange itself, as the server's events and the client recorded it
    client = record["client"]
    events = {e["event"]: e for e in record["events"]}
    if client["received"] != record["count"] or client["failure"]:
        problems.append(f"client: {client['received']}/{record['count']} echoes, {client}")
    hello = events.get("hello_received", {})
    created = events.get("duologue_created", {})
    closed = events.get("duologue_closed", {})
    same(
        "HELLO session (server event vs client)",
        hello.get("client_session", -1) or 0,
        client["client_session"],
    )
    same(
        "duologue session (server event vs client)",
        created.get("session_id", -1) or 0,
        client["duologue_session"],
    )
    same("echoes (server event)", closed.get("messages", -1), record["count"])
    flows: dict[str, tuple[int, Callable[[Frame], bool]]] = {
        "HELLO (client to server port)": (
            client["client_session"],
            lambda f: f.dst_port == record["server_port"],
        ),
        "all-clients replies (server control port)": (
            next(p["session_id"] for p in publications if p["role"] == "server"),
            lambda f: f.src_port == record["control_port"],
        ),
        "duologue, client to server": (
            client["duologue_session"],
            lambda f: f.dst_port == created.get("data_port"),
        ),
        "duologue, server to client": (
            client["duologue_session"],
            lambda f: f.src_port == created.get("control_port"),
        ),
    }
    for what, (session, matches) in flows.items():
        data = [
            f
            for f in sent_frames
            if f.kind == "DATA" and f["session_id"] == _u32(session) and matches(f)
        ]
        if not data:
            problems.append(f"{what}: no DATA of session {session} in the capture")
    # Every echo (both ways) is two fragments: begin-only frames, each counted once.
    begins = {
        (f.dst_port, f["session_id"], f["term_id"], f["term_offset"])
        for f in sent_frames
        if f.kind == "DATA" and f["flags"] & 0xC0 == 0x80
    }
    same("fragmented messages (begin fragments)", len(begins), 2 * record["count"])

    notes.append(
        "the dissector shows session, stream and term ids as unsigned 32-bit; echo and the "
        "reference captures treat them as signed int32: compared modulo 2**32"
    )
    notes.append(
        "the dissector spans a heartbeat as 24 bytes (no reserved value), though 32 travel; "
        "the reference captures of the Aeron C driver show the same"
    )
    eos_as_data = sum(
        1
        for d in datagrams
        for f in d.frames
        if f.kind == "HEARTBEAT" and f.shown_as == "aeron.data"
    )
    notes.append(
        f"the dissector shows the {eos_as_data} end-of-stream heartbeats (flags 0xE0, length 0) "
        "as 0-length Data Frames spanning 32 bytes, plain ones as Heartbeat Frames: both are "
        "counted as HEARTBEAT here; the reference captures show the same"
    )
    notes.append(
        "the dissector names only the SETUP flag (0x80) of an SM; the EOS (0x40) and echo's "
        "cookie (0x20) flags are shown as bare bits, without an expert info"
    )
    return Report(
        datagrams=len(datagrams),
        counts=counts,
        retransmitted_frames=len(retransmitted),
        problems=problems,
        notes=notes,
    )


# ------------------------------------------------------------------------------------ capturing


def require_capture_support() -> None:
    """Raise CaptureError with the reason if this process cannot make the capture."""
    if not sys.platform.startswith("linux"):
        raise CaptureError(f"the capture needs Linux network namespaces, this is {sys.platform}")
    if os.geteuid() != 0:
        raise CaptureError("the capture needs root (a network namespace and a capture on lo)")
    missing = [tool for tool in ("ip", "nft", "tshark") if shutil.which(tool) is None]
    if missing:
        raise CaptureError(
            f"missing {missing}: install them, e.g. `apt-get install -y iproute2 nftables tshark`"
        )


def _run(argv: list[str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode:
        raise CaptureError(f"{' '.join(argv)} failed: {proc.stderr.strip()}")


def _wait_for_capture(tshark: subprocess.Popen[bytes], log: Path, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if "Capturing on" in log.read_text(errors="replace"):
            return
        if tshark.poll() is not None:
            break
        time.sleep(0.05)
    raise CaptureError(f"tshark did not start capturing: {log.read_text(errors='replace')}")


def capture_exchange(
    workdir: Path, *, count: int = 150, loss: float = 0.1, seed: int = 1
) -> tuple[Path, dict[str, Any]]:
    """Run the exchange in a fresh namespace under tshark; the pcapng and the record."""
    require_capture_support()
    workdir.mkdir(parents=True, exist_ok=True)
    pcap = workdir / "exchange.pcapng"
    record_path = workdir / "record.json"
    log = workdir / "tshark.log"
    namespace = f"ewire-{secrets.token_hex(3)}"
    _run(["ip", "netns", "add", namespace])
    try:
        # The transport hands the kernel runs of datagrams in one call (UDP GSO). A capture
        # taps a packet before the device would cut it, so on loopback a run shows as one big
        # packet; `gso_max_segs 1` makes the kernel cut runs before the tap, as a NIC does on
        # the wire, and the capture shows each datagram.
        _run(["ip", "-n", namespace, "link", "set", "lo", "gso_max_segs", "1", "up"])
        with log.open("wb") as log_file:
            tshark = subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    namespace,
                    "tshark",
                    "-i",
                    "lo",
                    "-f",
                    "udp",
                    "-w",
                    str(pcap),
                ],
                stdout=log_file,
                stderr=subprocess.STDOUT,
            )
        try:
            _wait_for_capture(tshark, log)
            exchange = subprocess.run(
                [
                    "ip",
                    "netns",
                    "exec",
                    namespace,
                    sys.executable,
                    "-m",
                    "tests.wire.exchange",
                    "--out",
                    str(record_path),
                    "--count",
                    str(count),
                    "--loss",
                    str(loss),
                    "--seed",
                    str(seed),
                    "--loss-mode",
                    "nft",
                ],
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=180,
                check=False,
            )
            (workdir / "exchange.log").write_text(exchange.stdout + exchange.stderr)
            if exchange.returncode:
                raise CaptureError(
                    f"the exchange failed ({exchange.returncode}):\n"
                    f"{exchange.stdout}\n{exchange.stderr[-4000:]}"
                )
            # dumpcap reads the ring every 100 ms or so: let it take the last datagrams.
            time.sleep(1.0)
        finally:
            if tshark.poll() is None:
                tshark.send_signal(signal.SIGINT)
                try:
                    tshark.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    tshark.kill()
                    tshark.wait()
    finally:
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True, check=False)
    return pcap, json.loads(record_path.read_text())


def run(workdir: Path, *, count: int = 150, loss: float = 0.1, seed: int = 1) -> Report:
    pcap, record = capture_exchange(workdir, count=count, loss=loss, seed=seed)
    ports = (record["ports"][0], record["ports"][1])
    datagrams = tshark_decode(pcap, ports, workdir / "exchange.pdml")
    return check(datagrams, record, tshark_heuristic_protocols(pcap))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", type=Path, help="keep the pcapng, PDML and record here")
    parser.add_argument("--count", type=int, default=150)
    parser.add_argument("--loss", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if args.keep is not None:
        report = run(args.keep, count=args.count, loss=args.loss, seed=args.seed)
        where = f"\ncapture: {args.keep / 'exchange.pcapng'}"
    else:
        with tempfile.TemporaryDirectory(prefix="echo-wire-") as tmp:
            report = run(Path(tmp), count=args.count, loss=args.loss, seed=args.seed)
        where = ""
    print(report.summary() + where)
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
