"""`echo-lobby-client`: a lobby member driven by commands on standard input, its events
printed as lines; its resume token kept in a state file.

Driver: a command line.
"""

from __future__ import annotations

import shlex
import sys
from typing import Any

import click
import trio

from echo._cli import (
    log_options,
    server_key_pin_option,
)
from echo.lobby.cli.commands import (
    _command,
)
from echo.lobby.cli.options import (
    DEFAULT_PORT,
    _server_list,
)
from echo.lobby.cli.output import (
    _event_name,
    _print_event,
    _Printer,
)

CLIENT_EPILOG = """\b
Commands, one a line on standard input (arguments split like a shell's):
  create NAME [MAX] [private] [KEY=VALUE...]   join LOBBY_ID        code JOIN_CODE
  quick [KEY=VALUE | KEY=LOW..HIGH | free=N]...  search [FILTERS...] [page=N]   leave
  meta KEY=VALUE...   lock   unlock   kick M   ban M   transfer M   (owner only)
  attr KEY=VALUE...   ready   unready   chat TEXT...   state   sleep SECONDS
  start [TAG=VALUE...]   (owner; a game server announcing those tags, e.g. region=eu)
  ticket   (a fresh ticket for the running game)   report SERVER_ID REASON...   (its
  game server refused our ticket)
  queue MODE REGION [skill=N] [size=N] [party] [start] [strict]   cancel   (matchmaker)
  wait EVENT [SECONDS]   (until an event of that name arrives, e.g. wait game)   quit
Values that are integers are sent as numbers; KEY= deletes a key.
\b
Output, one line each: "ok COMMAND", "refused CODE message", "joined ID SERVER",
"lobby ID NAME MEMBERS/MAX home=SERVER KEY=VALUE...", and the events as they arrive:
snapshot, member_joined, member_left, owner, metadata, locked, attributes, ready, presence,
banned, game SERVER_ID ADDRESS TICKET_HEX control_port=N duologue_ports=MODE match_id=N,
game_ended MATCH_ID result={...}, chat MEMBER TEXT, rehomed, reconnected, left,
"queued TICKET SERVER", matched TICKET LOBBY_ID WAITED_MS, queue_left TICKET REASON;
with --state-file also "token_saved LOBBY_ID" (each new resume token, kept in the file) and,
after a restart, "resumed LOBBY_ID SERVER" or "resume_refused CODE message" (then it starts
without a seat). With --json, one JSON object a line with an "event" key.
\b
Exit status: 0 standard input ended (or quit) and every command was accepted; 1 no lobby
server answered or let the member in (or all went away); 2 a bad command line; 3 some command
was refused or malformed (the lines say which); 4 a wait timed out; 5 the lobby refused the
--token (the reason is printed: expired, not_yet_valid, wrong_audience, bad_signature,
unknown_kid, ...).
"""

STATE_FILE_HELP = (
    "Keep this member's resume token in FILE (written atomically, mode 0600). If FILE exists "
    "at start, take the seat it names back (a restart after a crash): prints "
    '"resumed LOBBY_ID". A corrupt FILE or a refused token is said on standard error and '
    "the client starts without a seat; a FILE of another member is a usage error."
)


@click.command(epilog=CLIENT_EPILOG)
@click.option(
    "--servers",
    default=f"127.0.0.1:{DEFAULT_PORT}",
    show_default=True,
    help="Comma-separated HOST:PORT of every lobby server (the same list as theirs).",
)
@click.option(
    "--member",
    default=None,
    help="Your member id (1..64 printable bytes) [default: the sub of --token; one of the "
    "two is needed].",
)
@click.option(
    "--token",
    default=None,
    metavar="TOKEN|@FILE",
    help="Your identity token from the game's backend, or @FILE to read it from a file, for a "
    "lobby that verifies identities (echo-lobby --auth-key).",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per output line.")
@click.option(
    "--timeout",
    default=10.0,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="Seconds to wait for a server's answer.",
)
@click.option(
    "--connect-timeout",
    default=3.0,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="Seconds a handshake with one lobby server may take before the next is tried "
    "(raise it for a server admitting hundreds of members a second).",
)
@click.option(
    "--liveness",
    default=2.5,
    show_default=True,
    type=click.FloatRange(min=0.5),
    help="Seconds of silence from the server before the session counts as dropped and the "
    "member reconnects, or re-creates its lobby on the next server (the server heartbeats "
    "every 0.8 s; failover within 5 s assumes the default).",
)
@click.option(
    "--state-file",
    default=None,
    metavar="FILE",
    type=click.Path(dir_okay=False),
    help=STATE_FILE_HELP,
)
@server_key_pin_option(
    "Encrypt the sessions to the lobby servers, pinning this key: the ring's public key as "
    "echo-lobby prints it (every server of the ring loads the same --key file), its SHA-256 "
    "fingerprint, or a file holding one. A server that does not prove it is not used (never a "
    "fallback to the clear). Default: no encryption."
)
@log_options(default_level="warning")
def client_main(
    servers: str,
    member: str | None,
    token: str | None,
    as_json: bool,
    timeout: float,
    connect_timeout: float,
    liveness: float,
    state_file: str | None,
    server_key: str | None,
    log_format: str,
    log_level: str,
) -> None:
    """A lobby member driven by commands on standard input; events are printed as lines."""
    from echo.log import configure_logging

    configure_logging(log_format, log_level)  # type: ignore[arg-type]
    listed = _server_list(servers, "--servers", resolve=True)
    if not listed:
        raise click.BadParameter("no servers listed", param_hint="--servers")
    token = _token(token)
    member = _member(member, token)
    if not 1 <= len(member.encode()) <= 64 or not member.isprintable():
        raise click.BadParameter("1..64 printable bytes", param_hint="--member")
    out = _Printer(as_json)
    resume = _saved_token(state_file, member)
    try:
        code = trio.run(
            _client, list(listed), member, timeout, out, connect_timeout, liveness, state_file,
            resume, token, server_key,
        )  # fmt: skip
    except KeyboardInterrupt:
        code = 0
    sys.exit(code)


def _token(value: str | None) -> str | None:
    """--token: the token itself, or @FILE holding it (surrounding whitespace dropped)."""
    if value is None:
        return None
    if value.startswith("@"):
        try:
            with open(value[1:], encoding="ascii") as handle:
                value = handle.read(64 * 1024)
        except (OSError, UnicodeDecodeError) as error:
            why = error.strerror if isinstance(error, OSError) else "not ASCII"
            raise click.BadParameter(
                f"cannot read {value[1:]}: {why}", param_hint="--token"
            ) from None
    value = value.strip()
    if not value:
        raise click.BadParameter("an empty token", param_hint="--token")
    return value


def _member(member: str | None, token: str | None) -> str:
    from echo.lobby.client import member_of

    if member is None and token is None:
        raise click.BadParameter(
            "give --member, or --token (its sub is the member id)", param_hint="--member"
        )
    try:
        return member_of(member, token)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--token") from None


def _saved_token(state_file: str | None, member: str) -> bytes | None:
    """The resume token kept in `state_file` for `member`, if there is one to use."""
    from echo.lobby.statefile import StateFileError, read_state

    if state_file is None:
        return None
    try:
        saved = read_state(state_file)
    except StateFileError as error:
        click.echo(
            f"echo-lobby-client: state file {state_file} is {error}: starting without a seat "
            "(the file is replaced once seated)",
            err=True,
        )
        return None
    if saved is None:
        return None
    if saved.member != member:
        raise click.BadParameter(
            f"it keeps the seat of member {saved.member!r}, not {member!r}",
            param_hint="--state-file",
        )
    return saved.token


async def _client(
    servers: list[str],
    member: str,
    timeout: float,
    out: _Printer,
    connect_timeout: float,
    liveness: float,
    state_file: str | None = None,
    resume: bytes | None = None,
    identity: str | None = None,
    server_key: str | None = None,
) -> int:
    import echo.lobby.client as lc
    from echo.lobby.statefile import remove_state

    options: dict[str, Any] = {
        "identity_token": identity,
        "timeout": timeout,
        "connect_timeout": connect_timeout,
        "liveness": liveness,
        "server_key": server_key,
    }
    try:
        try:
            async with lc.connect(
                servers, member=member, resume_token=resume, **options
            ) as lobby:  # fmt: skip
                return await _session(lobby, member, timeout, out, state_file)
        except lc.ResumeRefused as refused:
            # The seat is gone (grace over), or the token is stale: start without it.
            click.echo(
                f"echo-lobby-client: could not take the seat back ({refused}): starting "
                "without a seat",
                err=True,
            )
            reason = refused.reason.name
            out("resume_refused", reason, refused.message, code=reason, message=refused.message)
            if state_file is not None:
                remove_state(state_file)
            async with lc.connect(servers, member=member, **options) as lobby:
                return await _session(lobby, member, timeout, out, state_file)
    except lc.AuthRefused as error:
        click.echo(f"echo-lobby-client: {error}", err=True)
        return 5
    except lc.LobbyUnavailable as error:
        click.echo(f"echo-lobby-client: {error}", err=True)
        return 1


def _keep_token(out: _Printer, state_file: str | None, member: str, event: Any) -> None:
    """With --state-file: each new resume token saved, the file removed once seatless."""
    from echo.lobby import protocol as p
    from echo.lobby.client import Left
    from echo.lobby.statefile import SavedSeat, StateFileError, remove_state, write_state

    if state_file is None:
        return
    try:
        if isinstance(event, p.ResumeToken):
            write_state(state_file, SavedSeat(member, event.lobby_id, event.token))
            out("token_saved", event.lobby_id, lobby=event.lobby_id, file=state_file)
        elif isinstance(event, Left):
            remove_state(state_file)
    except (OSError, StateFileError) as error:
        click.echo(f"echo-lobby-client: state file {state_file}: {error}", err=True)


class _Seen:
    """The names of the events printed so far, and a wait for the next one."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.arrived = trio.Event()

    def add(self, name: str) -> None:
        self.names.append(name)
        self.arrived.set()
        self.arrived = trio.Event()

    async def wait_for(self, name: str, limit: float) -> bool:
        """Until an event `name` arrives (True), at most `limit` seconds (False)."""
        start = len(self.names)
        with trio.move_on_after(limit) as waited:
            while name not in self.names[start:]:
                await self.arrived.wait()
        return not waited.cancelled_caught


async def _session(
    lobby: Any, member: str, timeout: float, out: _Printer, state_file: str | None
) -> int:
    """Commands from standard input on a connected client, events printed; the exit status."""
    status = 0
    seen = _Seen()
    out("connected", lobby.server, server=lobby.server, member=member)

    async def show_events() -> None:
        async for event in lobby.events():
            _print_event(out, event)
            _keep_token(out, state_file, member, event)
            seen.add(_event_name(event))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(show_events)
        stdin = trio.wrap_file(sys.stdin)
        while True:
            line = await stdin.readline()
            if not line:
                break
            try:
                words = shlex.split(line)
            except ValueError as error:
                out(
                    "refused",
                    "BAD_COMMAND",
                    str(error),
                    code="BAD_COMMAND",
                    message=str(error),
                )
                status = 3
                continue
            if not words or words[0].startswith("#"):
                continue
            if words[0] == "quit":
                break
            if words[0] == "wait":
                name = words[1] if len(words) > 1 else "snapshot"
                limit = float(words[2]) if len(words) > 2 else timeout
                if not await seen.wait_for(name, limit):
                    out("timeout", name, event_name=name)
                    status = 4
                continue
            status = await _run_command(lobby, words, out) or status
        nursery.cancel_scope.cancel()
    return status


async def _run_command(lobby: Any, words: list[str], out: _Printer) -> int:
    """One command; 3 if it was refused or malformed (said on a "refused" line), else 0."""
    import echo.lobby.client as lc

    try:
        await _command(lobby, words, out)
    except lc.LobbyError as error:
        out(
            "refused",
            error.code.name,
            error.message,
            command=words[0],
            code=error.code.name,
            message=error.message,
        )
        return 3
    except (ValueError, IndexError) as error:
        # An IndexError is an argument the command needs and did not get.
        why = "missing argument" if isinstance(error, IndexError) else str(error)
        out(
            "refused",
            "BAD_COMMAND",
            why,
            command=words[0],
            code="BAD_COMMAND",
            message=why,
        )
        return 3
    return 0
