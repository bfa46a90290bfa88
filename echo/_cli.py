"""What the command-line tools share."""

from __future__ import annotations


def sole_error(
    error: BaseException, kinds: type[BaseException] | tuple[type[BaseException], ...]
) -> BaseException | None:
    """The one exception of `kinds` that `error` is, or wraps; else None.

    A task that fails inside trio nurseries reaches `trio.run`'s caller wrapped in one
    ExceptionGroup per nursery: a port already in use must still be one clear line, not
    a traceback. Several failures at once, or anything else, are not ours to summarise.
    """
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    return error if isinstance(error, kinds) else None


def one_line(error: BaseException) -> str:
    """What went wrong, for a person: an OSError's own words without its `[Errno N]`."""
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return str(error)
