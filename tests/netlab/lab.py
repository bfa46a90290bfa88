"""A network-namespace lab: a public server and clients behind real nftables NAT routers.

Topology built by :func:`nat_lab` (every box is its own network namespace)::

                          "public internet" 198.18.0.0/24
    server (eth0 198.18.0.1) ──veth── switch ns [bridge br0] ──veth── router1 (wan0 198.18.0.2)
                                                             ──veth── router2 (wan0 198.18.0.3) ...

    router<n> [bridge lan0 10.77.<n>.1/24] ──veth── client <i> = 1, 2... (eth0 10.77.<n>.<9+i>)

Why a separate *switch* namespace holding the public bridge: every interface of the lab then lives
inside a lab namespace (none in the root namespace), so interface names can be fixed and short
(``eth0``, ``wan0``...) without clashing with parallel labs, and deleting the namespaces is enough
to remove every veth, even after a crash.  The server has only the connected public route, so it
cannot reach 10.77.x.x at all (as on the real internet).

Each router runs the NAT of docs/architecture.md, Test layers: ``masquerade random`` on ``wan0``
(source ports really change) and a forward chain with ``policy drop`` that accepts new traffic only
from the private side and inbound only ``ct state established,related``.  Under that NAT the server
can answer a client but cannot open a flow to a port the client named (the io7m Aeron guide §3.3.6,
§4.1).

Naming: namespaces are ``<prefix><id>-<role>`` (<= 15 characters) where ``<id>`` is 4 random base-36
characters.  Before creating namespaces a lab writes ``/run/echo-netlab/<prefix><id>.json`` with its
creator's pid and the creator's start time; :func:`sweep_stale_labs` removes labs whose creator is
gone (dead pid, or the pid now belongs to a process started later, i.e. a reused pid).  Labs of live
parallel runs are never touched.

:func:`pair_lab` builds the simplest lab on the same machinery: two hosts ``<id>-a`` and ``<id>-b``
joined by one veth pair (no router, no NAT), for measurements over one lossy link.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import secrets
import selectors
import shutil
import signal
import string
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any, Protocol, TypeVar

import attrs

__all__ = [
    "DEFAULT_PREFIX",
    "SERVER_PUBLIC_IP",
    "Host",
    "Lab",
    "LineReader",
    "NatLabFactory",
    "NetLabCommandError",
    "NetLabError",
    "NetLabUnavailable",
    "PairLab",
    "Site",
    "enter_namespace",
    "list_namespaces",
    "nat_lab",
    "pair_lab",
    "require_netns_support",
    "sweep_stale_labs",
]

DEFAULT_PREFIX = "enl"
PUBLIC_SUBNET = "198.18.0.0/24"
SERVER_PUBLIC_IP = "198.18.0.1"
REGISTRY_DIR = Path("/run/echo-netlab")
NETNS_DIR = Path("/run/netns")

# Linux IFNAMSIZ is 16 including the NUL; netns names have no such limit but we keep them as
# short so that they can double as interface-name-sized identifiers in logs and tools.
MAX_NAME_LEN = 15
_ID_LEN = 4
_ID_ALPHABET = string.ascii_lowercase + string.digits
_PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{0,5}$")

# Interface names inside the namespaces (fixed: they never meet in one namespace).
_SWITCH_BRIDGE = "br0"
_HOST_IF = "eth0"
_ROUTER_WAN = "wan0"
_ROUTER_LAN = "lan0"

_NAT_TABLE = "echo_nat"
_LOSS_TABLE = "lossy"

# pair_lab: one point-to-point link.
PAIR_A_IP = "10.78.0.1"
PAIR_B_IP = "10.78.0.2"
_PAIR_PREFIX_LEN = 24

# <linux/sched.h>; os.setns / os.CLONE_NEWNET only exist from Python 3.12.
_CLONE_NEWNET = 0x40000000


class NetLabError(RuntimeError):
    """The lab could not be built or torn down."""


class NetLabUnavailable(NetLabError):
    """This machine/user cannot create network namespaces (not root, no ``ip``/``nft``)."""


class NetLabCommandError(subprocess.CalledProcessError):
    """A command run for (or inside) the lab failed; the message carries its stderr."""

    def __str__(self) -> str:
        err = self.stderr if isinstance(self.stderr, str) else repr(self.stderr)
        return f"{super().__str__()}\nstderr: {err.strip()}"


def _run(argv: Sequence[str], *, stdin: str | None = None, timeout: float = 30) -> str:
    proc = subprocess.run(
        list(argv), input=stdin, capture_output=True, text=True, timeout=timeout, check=False
    )
    if proc.returncode != 0:
        raise NetLabCommandError(proc.returncode, list(argv), proc.stdout, proc.stderr)
    return proc.stdout


def require_netns_support() -> None:
    """Raise :class:`NetLabUnavailable` with the reason if this process cannot build a lab.

    Tests must fail loudly (never skip) when the lab cannot be built: the namespace labs rely on
    root being available here and in CI.
    """
    if not sys.platform.startswith("linux"):
        raise NetLabUnavailable(f"network namespaces need Linux, this is {sys.platform}")
    if os.geteuid() != 0:
        raise NetLabUnavailable(
            "the netns lab needs root (CAP_SYS_ADMIN + CAP_NET_ADMIN) to create network "
            f"namespaces; running as uid {os.geteuid()}"
        )
    missing = [tool for tool in ("ip", "nft") if shutil.which(tool) is None]
    if missing:
        raise NetLabUnavailable(
            f"missing tools {missing}: install them, e.g. `apt-get install -y iproute2 nftables`"
        )


def list_namespaces() -> list[str]:
    """Names of the named network namespaces (what ``ip netns list`` shows)."""
    try:
        return sorted(os.listdir(NETNS_DIR))
    except FileNotFoundError:
        return []


# --------------------------------------------------------------------------------------------
# Hosts


@attrs.define(eq=False)
class Host:
    """One network namespace of the lab, seen as a machine.

    ``ip`` is the address others use to reach it (server: its public IP, router: its public IP,
    client: its *private* IP); ``public_ip`` is what the public side sees as its source (a
    client's router's public IP).
    """

    name: str
    role: str
    ip: str
    public_ip: str
    interface: str
    _processes: list[subprocess.Popen[bytes]] = attrs.field(repr=False, alias="processes")

    def argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` wrapped so that it runs inside this namespace (for trio.run_process etc.)."""
        return ["ip", "netns", "exec", self.name, *argv]

    def run(self, argv: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen[bytes]:
        """Start ``argv`` inside this namespace; the lab kills it (if still running) on exit."""
        proc: subprocess.Popen[bytes] = subprocess.Popen(self.argv(argv), **popen_kwargs)
        self._processes.append(proc)
        return proc

    def check_output(self, argv: Sequence[str], timeout: float = 30) -> str:
        """Run ``argv`` inside this namespace, return its stdout; raise on non-zero exit."""
        return _run(self.argv(argv), timeout=timeout)

    def python(self, *args: str, **popen_kwargs: Any) -> subprocess.Popen[bytes]:
        """Start this interpreter (the venv python, so ``echo`` is importable) in the namespace."""
        return self.run([sys.executable, *args], **popen_kwargs)

    def set_loss(self, percent: float, *, forwarded: bool = False) -> None:
        """Drop ``percent`` % of incoming UDP at random; 0 removes the loss rules.

        The drop is on the input hook, so the sender's ``sendto`` still succeeds and the
        datagram is really lost in the network (an output-hook drop would surface as EPERM,
        docs/architecture.md, Test layers).  ``forwarded=True`` also drops UDP *passing through*
        this host (useful on a router to make the link of all its clients lossy, both directions).
        """
        if not 0 <= percent <= 100:
            raise ValueError(f"loss percent must be within 0..100, got {percent}")
        # Hundredths of a percent so that fractional percentages are honoured.
        threshold = round(percent * 100)
        # Adding then deleting the table first makes the whole replacement one atomic nft
        # transaction that works whether or not the table already exists (and it resets the
        # counters read by loss_counters).
        script = f"table inet {_LOSS_TABLE}\ndelete table inet {_LOSS_TABLE}\n"
        if threshold > 0:
            # Two counters: every UDP packet the hook sees, then the ones the rule drops, so the
            # loss really applied can be read back (loss_counters).
            rules = (
                "    meta l4proto udp counter\n"
                f"    meta l4proto udp numgen random mod 10000 < {threshold} counter drop\n"
            )
            chains = (
                "  chain inp {\n"
                "    type filter hook input priority filter - 10; policy accept;\n"
                f"{rules}"
                "  }\n"
            )
            if forwarded:
                chains += (
                    "  chain fwdloss {\n"
                    "    type filter hook forward priority filter - 10; policy accept;\n"
                    f"{rules}"
                    "  }\n"
                )
            script += f"table inet {_LOSS_TABLE} {{\n{chains}}}\n"
        _run(self.argv(["nft", "-f", "-"]), stdin=script)

    def loss_counters(self) -> dict[str, int]:
        """UDP packets the loss rules saw and dropped since the last :meth:`set_loss`.

        ``{"seen": n, "dropped": m}`` from the rules' nft counters (input and, with
        ``forwarded=True``, forward hooks together); zeros when no loss is set.
        """
        try:
            listing = _run(self.argv(["nft", "-j", "list", "table", "inet", _LOSS_TABLE]))
        except NetLabCommandError as error:
            if "No such file or directory" in str(error.stderr):
                return {"seen": 0, "dropped": 0}
            raise
        counts = {"seen": 0, "dropped": 0}
        for item in json.loads(listing)["nftables"]:
            rule = item.get("rule")
            if rule is None:
                continue
            statements = rule["expr"]
            counter = next((s["counter"] for s in statements if "counter" in s), None)
            if counter is None:
                continue
            dropping = any("drop" in s for s in statements)
            counts["dropped" if dropping else "seen"] += int(counter["packets"])
        return counts


@attrs.frozen
class Site:
    """One private site: a NAT router and the clients on its LAN."""

    index: int
    router: Host
    clients: list[Host]
    lan_ip: str  # the router's private address, the clients' default gateway
    subnet: str


@attrs.define(eq=False)
class Lab:
    """A built lab; see the module docstring for the topology."""

    lab_id: str
    server: Host
    sites: list[Site]
    switch: str  # namespace holding the public bridge (infrastructure, not a host)
    _processes: list[subprocess.Popen[bytes]] = attrs.field(repr=False, alias="processes")

    def hosts(self) -> list[Host]:
        """Server, then every router, then every client."""
        return [
            self.server,
            *(site.router for site in self.sites),
            *(client for site in self.sites for client in site.clients),
        ]

    def clients(self) -> list[Host]:
        return [client for site in self.sites for client in site.clients]

    def namespaces(self) -> list[str]:
        """Every namespace this lab owns (including the switch)."""
        return [self.switch, *(host.name for host in self.hosts())]


@attrs.define(eq=False)
class PairLab:
    """Two hosts ``a`` and ``b`` joined by one veth pair (``eth0`` on both sides)."""

    lab_id: str
    a: Host
    b: Host
    _processes: list[subprocess.Popen[bytes]] = attrs.field(repr=False, alias="processes")

    def hosts(self) -> list[Host]:
        return [self.a, self.b]

    def namespaces(self) -> list[str]:
        return [host.name for host in self.hosts()]


def enter_namespace(name: str) -> None:
    """Move the calling thread into the lab namespace ``name`` (sockets it opens then live there).

    For a child process that cannot be started through ``ip netns exec`` (e.g. a multiprocessing
    child that talks to its parent over a pipe): call it first thing, before opening sockets or
    starting threads.  Only the network namespace changes, unlike ``ip netns exec`` which also
    remounts /sys; nothing here needs that.
    """
    fd = os.open(NETNS_DIR / name, os.O_RDONLY | os.O_CLOEXEC)
    try:
        setns = getattr(os, "setns", None)
        if setns is not None:
            setns(fd, _CLONE_NEWNET)
            return
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into network namespace {name}: {os.strerror(err)}")
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------------------
# Building and tearing down


def _new_lab_id(prefix: str) -> str:
    if not _PREFIX_RE.match(prefix):
        raise ValueError(f"prefix must match {_PREFIX_RE.pattern}, got {prefix!r}")
    return prefix + "".join(secrets.choice(_ID_ALPHABET) for _ in range(_ID_LEN))


def _plan(prefix: str, sites: int, clients_per_site: int) -> Lab:
    lab_id = _new_lab_id(prefix)
    if not 1 <= sites <= 250:
        raise ValueError(f"sites must be within 1..250, got {sites}")
    if not 1 <= clients_per_site <= 240:
        raise ValueError(f"clients_per_site must be within 1..240, got {clients_per_site}")
    longest = f"{lab_id}-r{sites}c{clients_per_site}"
    if len(longest) > MAX_NAME_LEN:
        raise ValueError(
            f"namespace names would exceed {MAX_NAME_LEN} characters ({longest!r}); "
            "use a shorter prefix or fewer sites/clients"
        )
    processes: list[subprocess.Popen[bytes]] = []
    server = Host(
        name=f"{lab_id}-s",
        role="server",
        ip=SERVER_PUBLIC_IP,
        public_ip=SERVER_PUBLIC_IP,
        interface=_HOST_IF,
        processes=processes,
    )
    site_list: list[Site] = []
    for n in range(1, sites + 1):
        public = f"198.18.0.{1 + n}"
        router = Host(
            name=f"{lab_id}-r{n}",
            role="router",
            ip=public,
            public_ip=public,
            interface=_ROUTER_WAN,
            processes=processes,
        )
        clients = [
            Host(
                name=f"{lab_id}-r{n}c{i}",
                role="client",
                ip=f"10.77.{n}.{9 + i}",
                public_ip=public,
                interface=_HOST_IF,
                processes=processes,
            )
            for i in range(1, clients_per_site + 1)
        ]
        site_list.append(
            Site(
                index=n,
                router=router,
                clients=clients,
                lan_ip=f"10.77.{n}.1",
                subnet=f"10.77.{n}.0/24",
            )
        )
    return Lab(
        lab_id=lab_id,
        server=server,
        sites=site_list,
        switch=f"{lab_id}-p",
        processes=processes,
    )


def _proc_start_ticks(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot, or None if no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # Field 22 (starttime); split after the ')' closing comm, which may contain spaces.
    return int(stat.rsplit(")", 1)[1].split()[19])


def _registry_path(lab_id: str) -> Path:
    return REGISTRY_DIR / f"{lab_id}.json"


_AnyLab = Lab | PairLab
_L = TypeVar("_L", Lab, PairLab)


def _write_registry(lab: _AnyLab) -> None:
    REGISTRY_DIR.mkdir(parents=True, exist_ok=True)
    pid = os.getpid()
    record = {
        "lab": lab.lab_id,
        "pid": pid,
        "pid_start": _proc_start_ticks(pid),
        "created": time.time(),
        "namespaces": lab.namespaces(),
    }
    _registry_path(lab.lab_id).write_text(json.dumps(record))


def _owner_alive(lab_id: str) -> bool:
    try:
        record = json.loads(_registry_path(lab_id).read_text())
        pid = int(record["pid"])
        recorded_start = record["pid_start"]
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        # No (readable) registry: a live lab writes it before its first namespace and removes it
        # after its last, so namespaces without one can only be leftovers.
        return False
    # Same pid *and* same start time: guards against the pid having been reused since the crash.
    return bool(_proc_start_ticks(pid) == recorded_start)


def _remove_namespace(name: str) -> None:
    """Kill whatever still runs inside ``name`` (only lab processes can), then delete it."""
    try:
        pids = _run(["ip", "netns", "pids", name]).split()
    except NetLabCommandError:
        pids = []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    # A namespace whose processes are gone is destroyed with all its interfaces (veth peers
    # included) once unmounted; failure here means it vanished already.
    with contextlib.suppress(NetLabCommandError):
        _run(["ip", "netns", "delete", name])


def sweep_stale_labs(prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Remove namespaces (and registry files) of crashed labs with this prefix.

    Only labs whose creator is gone are removed; returns the removed namespace names.
    """
    pattern = re.compile(rf"^({re.escape(prefix)}[0-9a-z]{{{_ID_LEN}}})-[a-z0-9]+$")
    by_lab: dict[str, list[str]] = {}
    for ns in list_namespaces():
        match = pattern.match(ns)
        if match:
            by_lab.setdefault(match.group(1), []).append(ns)
    id_re = re.compile(rf"^{re.escape(prefix)}[0-9a-z]{{{_ID_LEN}}}$")
    if REGISTRY_DIR.is_dir():
        for path in REGISTRY_DIR.glob("*.json"):
            if id_re.match(path.stem):
                by_lab.setdefault(path.stem, [])
    removed: list[str] = []
    for lab_id, names in sorted(by_lab.items()):
        if _owner_alive(lab_id):
            continue
        for ns in names:
            _remove_namespace(ns)
            removed.append(ns)
        _registry_path(lab_id).unlink(missing_ok=True)
    return removed


def _ip_batch(ns: str, commands: Sequence[str]) -> None:
    # One `ip` process per namespace instead of one per command keeps lab start-up fast.
    _run(["ip", "-n", ns, "-batch", "-"], stdin="\n".join(commands) + "\n")


def _sysctl(ns: str, *settings: str) -> None:
    _run(["ip", "netns", "exec", ns, "sysctl", "-q", "-w", *settings])


def _router_ruleset() -> str:
    return f"""
table inet {_NAT_TABLE} {{
  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    # 'random': pick the public source port at random, so ports really change (like a
    # carrier-grade NAT) and nothing can rely on the client's own port surviving.
    oifname "{_ROUTER_WAN}" masquerade random
  }}
  chain fwdfilter {{
    type filter hook forward priority filter; policy drop;
    # Inbound only as an answer to something a client sent (the io7m Aeron guide §4.1).
    ct state established,related accept
    iifname "{_ROUTER_LAN}" oifname "{_ROUTER_WAN}" accept
  }}
}}
"""


def _build(lab: Lab) -> None:
    for ns in lab.namespaces():
        _run(["ip", "netns", "add", ns])
    for ns in lab.namespaces():
        # No IPv6: keeps the links quiet (no DAD/RS/MLD) so captures show only the test traffic.
        settings = ["net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"]
        if ns in {site.router.name for site in lab.sites}:
            settings.append("net.ipv4.ip_forward=1")
        _sysctl(ns, *settings)

    switch_cmds = [
        "link set lo up",
        f"link add {_SWITCH_BRIDGE} type bridge forward_delay 0",
        f"link set {_SWITCH_BRIDGE} up",
        f"link add p-s type veth peer name {_HOST_IF} netns {lab.server.name}",
        f"link set p-s master {_SWITCH_BRIDGE} up",
    ]
    for site in lab.sites:
        port = f"p-r{site.index}"
        switch_cmds += [
            f"link add {port} type veth peer name {_ROUTER_WAN} netns {site.router.name}",
            f"link set {port} master {_SWITCH_BRIDGE} up",
        ]
    _ip_batch(lab.switch, switch_cmds)

    # The server gets only the connected public route: it cannot even try to reach 10.77/16.
    # gso_max_segs 1 on the hosts that send (server and clients), as in the pair lab below: a
    # UDP GSO batch is cut into datagrams before it leaves, so a loss rule drops datagrams one
    # at a time, not whole batches (which made "loss really happened" a matter of luck: a run
    # of 2,000 messages could cross in ~30 batches and lose none at 10 %).
    _ip_batch(
        lab.server.name,
        [
            "link set lo up",
            f"addr add {lab.server.ip}/24 dev {_HOST_IF}",
            f"link set {_HOST_IF} gso_max_segs 1",
            f"link set {_HOST_IF} up",
        ],
    )
    for site in lab.sites:
        router_cmds = [
            "link set lo up",
            f"addr add {site.router.public_ip}/24 dev {_ROUTER_WAN}",
            f"link set {_ROUTER_WAN} up",
            f"link add {_ROUTER_LAN} type bridge forward_delay 0",
            f"addr add {site.lan_ip}/24 dev {_ROUTER_LAN}",
            f"link set {_ROUTER_LAN} up",
        ]
        for i, client in enumerate(site.clients, start=1):
            port = f"lan-c{i}"
            router_cmds += [
                f"link add {port} type veth peer name {_HOST_IF} netns {client.name}",
                f"link set {port} master {_ROUTER_LAN} up",
            ]
        _ip_batch(site.router.name, router_cmds)
        _run(["ip", "netns", "exec", site.router.name, "nft", "-f", "-"], stdin=_router_ruleset())
        for client in site.clients:
            _ip_batch(
                client.name,
                [
                    "link set lo up",
                    f"addr add {client.ip}/24 dev {_HOST_IF}",
                    f"link set {_HOST_IF} gso_max_segs 1",
                    f"link set {_HOST_IF} up",
                    f"route add default via {site.lan_ip}",
                ],
            )


def _destroy(lab: _AnyLab) -> None:
    for proc in lab._processes:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
    for ns in lab.namespaces():
        if ns in list_namespaces():
            _remove_namespace(ns)
    left = [ns for ns in lab.namespaces() if ns in list_namespaces()]
    if left:
        raise NetLabError(f"could not remove lab namespaces {left}")
    # Last, so that a sweeper never mistakes a lab that is still tearing down for a stale one.
    _registry_path(lab.lab_id).unlink(missing_ok=True)


@contextlib.contextmanager
def nat_lab(
    *, sites: int = 1, clients_per_site: int = 1, prefix: str | None = None
) -> Iterator[Lab]:
    """Build a NAT lab (see module docstring), yield it, and always remove it afterwards.

    Blocking (it runs ``ip``/``nft``); from trio code enter it in a sync fixture or accept the
    short block at setup.  Raises :class:`NetLabUnavailable` if namespaces cannot be created.
    """
    prefix = DEFAULT_PREFIX if prefix is None else prefix
    lab = _plan(prefix, sites, clients_per_site)
    with _owned(lab, prefix, _build):
        yield lab


@contextlib.contextmanager
def _owned(lab: _L, prefix: str, build: Callable[[_L], None]) -> Iterator[None]:
    """Register ``lab``, build it, and remove it on every way out (error, Ctrl-C included)."""
    require_netns_support()
    sweep_stale_labs(prefix)
    _write_registry(lab)
    try:
        build(lab)
        yield
    finally:
        _destroy(lab)


def _build_pair(lab: PairLab) -> None:
    for ns in lab.namespaces():
        _run(["ip", "netns", "add", ns])
        _sysctl(ns, "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1")
    a, b = lab.a, lab.b
    # gso_max_segs 1: a UDP GSO batch (one sendmsg, many datagrams) is segmented in software
    # before the veth, as a real NIC does on the wire; otherwise the batch crosses the veth as
    # one packet and an nftables drop loses all of its datagrams at once, which is not random
    # per-datagram loss.
    _ip_batch(
        a.name,
        [
            "link set lo up",
            f"link add {_HOST_IF} type veth peer name {_HOST_IF} netns {b.name}",
            f"addr add {a.ip}/{_PAIR_PREFIX_LEN} dev {_HOST_IF}",
            f"link set {_HOST_IF} gso_max_segs 1",
            f"link set {_HOST_IF} up",
        ],
    )
    _ip_batch(
        b.name,
        [
            "link set lo up",
            f"addr add {b.ip}/{_PAIR_PREFIX_LEN} dev {_HOST_IF}",
            f"link set {_HOST_IF} gso_max_segs 1",
            f"link set {_HOST_IF} up",
        ],
    )


@contextlib.contextmanager
def pair_lab(*, prefix: str | None = None) -> Iterator[PairLab]:
    """Build two namespaces joined by a veth pair (see module docstring), always remove them.

    ``a`` is 10.78.0.1 and ``b`` 10.78.0.2 on ``eth0``; each side may :meth:`Host.set_loss`.
    Raises :class:`NetLabUnavailable` if namespaces cannot be created.
    """
    prefix = DEFAULT_PREFIX if prefix is None else prefix
    lab_id = _new_lab_id(prefix)
    processes: list[subprocess.Popen[bytes]] = []

    def host(side: str, ip: str) -> Host:
        return Host(
            name=f"{lab_id}-{side}",
            role=side,
            ip=ip,
            public_ip=ip,
            interface=_HOST_IF,
            processes=processes,
        )

    lab = PairLab(lab_id, host("a", PAIR_A_IP), host("b", PAIR_B_IP), processes=processes)
    with _owned(lab, prefix, _build_pair):
        yield lab


class NatLabFactory(Protocol):
    """Type of the ``nat_lab_factory`` fixture (tests/netlab/fixtures.py)."""

    def __call__(
        self, *, sites: int = 1, clients_per_site: int = 1, prefix: str | None = None
    ) -> Lab: ...


# --------------------------------------------------------------------------------------------
# Reading output of processes started in the lab


class LineReader:
    """Read lines from a child's binary pipe with a deadline (a hung child fails, not hangs)."""

    def __init__(self, stream: IO[bytes] | None) -> None:
        if stream is None:
            raise ValueError("start the process with stdout=subprocess.PIPE")
        self._fd = stream.fileno()
        self._buffer = b""
        self._eof = False

    def readline(self, timeout: float) -> str:
        """The next line without its newline; TimeoutError / EOFError if none comes."""
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(self._fd, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                if self._eof:
                    raise EOFError(f"stream closed; unterminated data: {self._buffer!r}")
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not sel.select(remaining):
                    raise TimeoutError(f"no line within {timeout}s; so far: {self._buffer!r}")
                chunk = os.read(self._fd, 65536)
                if chunk:
                    self._buffer += chunk
                else:
                    self._eof = True
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()
