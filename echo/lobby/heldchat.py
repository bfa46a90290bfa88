"""Chat lines kept for the seated members who are away, handed to them when they come back.

A member whose session dropped keeps its seat as RECONNECTING for the grace period
(`echo.lobby.state`), and so does every member of a lobby re-created from a copy until it
arrives on the new home. A chat line said meanwhile goes to the connected members only; without
this hold the member coming back would never see it. That is how a line was lost in a drain
(`echo.lobby.drain`): the member whose request got no reply from the draining server re-homes
first, re-creates the lobby on the next server and says its line again there, a fraction of a
second before the others of its lobby arrive.

So each line is also kept, per away member, up to `LobbyConfig.held_chat_bytes` of text (the
most recent lines win: older ones are dropped and counted), and given to that member right
after the lobby's state once it is back (`take`). A seat that goes (left, expired, displaced)
takes its lines with it (`forget`). Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from echo.lobby.protocol import ChatLine


class HeldChat:
    """The chat lines waiting for away members, per member."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes cannot be negative")
        self.max_bytes = max_bytes
        self._lines: dict[str, deque[tuple[ChatLine, int]]] = {}
        self._bytes: dict[str, int] = {}

    def __len__(self) -> int:
        """How many members have lines waiting."""
        return len(self._lines)

    def waiting(self, member_id: str) -> int:
        """How many lines wait for `member_id`."""
        return len(self._lines.get(member_id, ()))

    def keep(self, members: Iterable[str], line: ChatLine) -> int:
        """Keep `line` for each of `members`; how many older lines that pushed out (a line
        larger than the whole hold is not kept, and counts as one)."""
        size = len(line.text.encode())
        dropped = 0
        for member_id in members:
            if size > self.max_bytes:
                dropped += 1
                continue
            lines = self._lines.setdefault(member_id, deque())
            total = self._bytes.get(member_id, 0) + size
            while total > self.max_bytes:
                _, gone = lines.popleft()
                total -= gone
                dropped += 1
            lines.append((line, size))
            self._bytes[member_id] = total
        return dropped

    def take(self, member_id: str, lobby_id: int) -> list[ChatLine]:
        """The lines kept for `member_id` in `lobby_id`, oldest first, and forget them all
        (lines of another lobby are from a seat the member no longer has)."""
        lines = self._lines.pop(member_id, None)
        self._bytes.pop(member_id, None)
        if not lines:
            return []
        return [line for line, _ in lines if line.lobby_id == lobby_id]

    def forget(self, member_id: str) -> None:
        """The member's seat went: its lines go with it."""
        self._lines.pop(member_id, None)
        self._bytes.pop(member_id, None)
