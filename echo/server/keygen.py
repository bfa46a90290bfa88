"""`echo-keygen FILE`: make a server key for encrypted sessions (echo.session.crypto)."""

from __future__ import annotations

import sys

import click

from echo.session.crypto import KeyFileError, generate_key_file


@click.command(
    epilog="\b\nExit status: 0 written; 1 the file exists (never overwritten) or cannot be\n"
    "written; 2 a bad command line."
)
@click.argument("path", type=click.Path(dir_okay=False))
def main(path: str) -> None:
    """Write a new X25519 server key to PATH (PKCS#8 PEM, mode 0600; never overwrites) and
    print its public key, for clients' --server-key, and its SHA-256 fingerprint.

    Start the server with:  echo-server --key PATH
    """
    try:
        key = generate_key_file(path)
    except KeyFileError as error:
        click.echo(f"echo-keygen: {error}", err=True)
        sys.exit(1)
    click.echo(key.public_text)
    click.echo(f"fingerprint SHA256:{key.fingerprint}", err=True)


if __name__ == "__main__":  # pragma: no cover
    main()
