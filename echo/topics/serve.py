"""``python -m echo.topics.serve`` is ``echo-topics``, for tests and the demo (which run from
the source tree, where the console script may not be installed); ``python -m
echo.topics.cli`` is ``echo-topic``."""

from echo.topics.cli import server_main

if __name__ == "__main__":  # pragma: no cover
    server_main()
