"""The session server's HELLOs on the all-clients channel: validated address, well formed,
the --encryption mode and the key exchange, the admission hook, the limits (with eviction of
never-joined duologues), then a duologue and the CONNECT (the io7m Aeron guide §4.4-§4.5).
"""

from __future__ import annotations

import inspect
import secrets
from typing import Any

import structlog
import trio

from echo.protocol import (
    ERROR_BAD_MESSAGE,
    ERROR_SERVER_FULL,
    ERROR_SHUTTING_DOWN,
    ERROR_TOO_MANY_FOR_IP,
    AllClientsError,
    BadMessage,
    Connect,
    Hello,
    encrypt_session,
    format_message,
)
from echo.session.config import Encryption
from echo.session.crypto import BadKey, Transcript, resume_secret, server_keys_from_shared
from echo.session.crypto import server_nonce as fresh_server_nonce
from echo.session.keywire import ConnectKey, HelloKey, append_connect_key, split_hello_key
from echo.session.resume import (
    RESUME_BITS,
    ResumableConnect,
    ResumableHello,
    Resume,
    format_resumable_connect,
    parse_client_request_untrusted,
)
from echo.session.server_base import (
    ERROR_BAD_KEY,
    ERROR_ENCRYPTION_OFF,
    ERROR_ENCRYPTION_REQUIRED,
    Admitted,
    Duologue,
)
from echo.session.server_resume import ResumeHost
from echo.transport import Message

_REFUSALS = {
    ERROR_SERVER_FULL: "server_full",
    ERROR_TOO_MANY_FOR_IP: "per_ip_limit",
    ERROR_BAD_MESSAGE: "bad_message",
    ERROR_SHUTTING_DOWN: "draining",
}

log = structlog.get_logger("echo.session")


class HelloHost(ResumeHost):
    """Answers HELLOs (and hands RESUMEs to `ResumeHost`) on the all-clients channel."""

    async def _refuse(self, reason: str, client_session: int, fields: dict[str, Any]) -> None:
        self.admissions[_REFUSALS.get(reason, "refused")] += 1
        self.events.emit("hello_rejected", reason=reason, **fields)
        await self._reply(format_message(AllClientsError(client_session, reason)), client_session)

    async def _on_hello(self, message: Message) -> None:
        """A message on the all-clients channel: a HELLO (or a RESUME) to answer."""
        self.hellos += 1
        client_session = message.session_id
        source_ip = message.source_ip
        key = self.admission.key_of(source_ip)
        fields = {"client_session": client_session, "source_ip": source_ip, "source_prefix": key}
        assert self.all_clients_pub is not None
        if self.transport_config.validate_addresses and not (
            self.all_clients_pub.has_destination_host(source_ip)
        ):
            # A HELLO from an address that never proved, by the MDC cookie exchange, that it
            # can receive our replies: most likely forged (the guide §4.3's spoofer). Drop it
            # silently: a reply could not reach it anyway, and a duologue would only hold the
            # victim's per-IP slots.
            self.unvalidated_hellos += 1
            self.admissions["unvalidated"] += 1
            self.events.emit("hello_rejected", reason="unvalidated address", **fields)
            return
        split = split_hello_key(message.data)
        if isinstance(split, BadMessage):
            self.events.emit("hello_received", **fields)
            await self._refuse(ERROR_BAD_MESSAGE, client_session, fields)
            return
        data, hello_key = split
        parsed = parse_client_request_untrusted(data, credentials=self.admit is not None)
        if isinstance(parsed, Resume):
            await self._on_resume(parsed, message, key)
            return
        self.events.emit("hello_received", **fields)
        if isinstance(parsed, BadMessage):
            await self._refuse(ERROR_BAD_MESSAGE, client_session, fields)
            return
        if self.draining:
            await self._refuse(ERROR_SHUTTING_DOWN, client_session, fields)
            return
        await self._admit_hello(parsed, hello_key, message, key, fields)

    async def _admit_hello(
        self,
        parsed: Hello | ResumableHello,
        hello_key: HelloKey | None,
        message: Message,
        key: str,
        fields: dict[str, Any],
    ) -> None:
        """A well-formed HELLO: its key, the admission hook, the limits; then a duologue and
        the CONNECT, or the refusal."""
        client_session = message.session_id
        request = parsed.hello if isinstance(parsed, ResumableHello) else parsed
        refusal, shared_secret = self._exchange_key(hello_key)
        if refusal is not None:
            self.key_refusals += 1
            await self._refuse(refusal, client_session, fields)
            return
        admitted: Admitted | None = None
        if self.admit is not None:
            verdict = await self._ask_admit((message.source_ip, message.source_port), request)
            if isinstance(verdict, str):
                await self._refuse(verdict, client_session, fields)
                return
            admitted = verdict
        decision = self.admission.decide(key, trio.current_time())
        if decision.reason is not None:
            await self._refuse(decision.reason, client_session, fields)
            return
        for victim in decision.evict:
            # A duologue nobody joined, most likely a spoofer's: freeing it lets the real
            # client in at once instead of after the expiry (the guide §4.3's lock-out attack).
            evicted = self.duologues.get(victim.slot_id)
            if evicted is not None:
                await self._delete(evicted, "evicted")
        duologue = await self._allocate(request, message, key)
        if duologue is None:
            await self._refuse(ERROR_SERVER_FULL, client_session, fields)
            return
        if admitted is not None:
            duologue.admission = admitted.claims
        text = self._connect(duologue, parsed, client_session, hello_key, shared_secret)
        self.admissions["accepted"] += 1
        await self._reply(text, client_session)

    def _exchange_key(self, hello_key: HelloKey | None) -> tuple[str | None, bytes | None]:
        """The refusal for the HELLO's key (or its lack), else the shared secret (None: in the
        clear). Before anything is allocated: a low-order key costs the server nothing more."""
        refusal = self._check_key(hello_key)
        if refusal is not None or hello_key is None:
            return refusal, None
        assert self.config.key is not None
        try:
            return None, self.config.key.exchange(hello_key.client_public)
        except BadKey:
            return ERROR_BAD_KEY, None

    def _connect(
        self,
        duologue: Duologue,
        parsed: Hello | ResumableHello,
        client_session: int,
        hello_key: HelloKey | None,
        shared_secret: bytes | None,
    ) -> bytes:
        """The CONNECT for an allocated duologue: with the key tail of an encrypted session,
        and the resume secret for a client that asked ("+R")."""
        request = parsed.hello if isinstance(parsed, ResumableHello) else parsed
        reply = Connect(
            client_session=client_session,
            data_port=duologue.data_port,
            control_port=duologue.control_port,
            encrypted_session=encrypt_session(duologue.session_id, request.key),
        )
        key_tail: ConnectKey | None = None
        if shared_secret is not None:
            assert hello_key is not None
            key_tail = self._agree(duologue, request, reply, hello_key, shared_secret)
        if isinstance(parsed, ResumableHello) and self.config.resume:
            # Only to a client that said "+R": the Echo 2.0 CONNECT is untouched for others.
            secret = secrets.randbits(RESUME_BITS)
            padded = secret ^ parsed.pad
            if duologue.keys is not None:
                # Encrypted: the secret comes from the session's keys, and the CONNECT's field
                # is noise (an on-path reader of the HELLO's pad must not learn the secret).
                secret = resume_secret(duologue.keys)
            duologue.slot.resume_secret = secret
            text = format_resumable_connect(ResumableConnect(reply, padded))
        else:
            text = format_message(reply)
        if key_tail is not None:
            text = append_connect_key(text, key_tail)
        return text

    def _check_key(self, hello_key: HelloKey | None) -> str | None:
        """Does the --encryption mode serve a HELLO with (or without) a key? The refusal."""
        mode = self.config.encryption_mode
        if hello_key is None:
            return ERROR_ENCRYPTION_REQUIRED if mode is Encryption.REQUIRED else None
        return ERROR_ENCRYPTION_OFF if mode is Encryption.OFF else None

    def _agree(
        self,
        duologue: Duologue,
        request: Hello,
        reply: Connect,
        hello_key: HelloKey,
        shared_secret: bytes,
    ) -> ConnectKey:
        """Derive the session's keys (into `duologue.keys`); the CONNECT's key tail."""
        key = self.config.key
        assert key is not None
        nonce = fresh_server_nonce()
        transcript = Transcript(
            client_public=hello_key.client_public,
            server_public=key.public,
            server_nonce=nonce,
            hello_key=request.key,
            client_session=reply.client_session,
            session_id=duologue.session_id,
            data_port=reply.data_port,
            control_port=reply.control_port,
        )
        duologue.keys, tag = server_keys_from_shared(shared_secret, transcript)
        self.encrypted_sessions += 1
        return ConnectKey(key.public, nonce, tag)

    async def _ask_admit(self, peer: tuple[str, int], request: Hello) -> str | Admitted | None:
        """The admission hook's verdict: None or Admitted to admit, else a one-line reason;
        a failing hook refuses."""
        assert self.admit is not None
        try:
            verdict = self.admit(peer, request.credentials)
            if inspect.isawaitable(verdict):
                verdict = await verdict
        except Exception:
            log.exception("admission_hook_failed", source_ip=peer[0])
            return "admission failed"
        if verdict is None or isinstance(verdict, Admitted):
            return verdict
        text = " ".join(str(verdict).split())[:200]
        return text or "refused"
