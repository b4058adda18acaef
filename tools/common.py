"""What every client command of the ``mesh`` CLI shares: the ``--bootstrap``/``--creds``
options and the one-line error reporting."""
from __future__ import annotations

import functools
import os
import sys

import click

from mesh.wire.errors import MeshError
from tools.security_cli import creds_option

__all__ = ["DEFAULT_BOOTSTRAP", "bootstrap_option", "friendly"]

DEFAULT_BOOTSTRAP = "127.0.0.1:7101"


def bootstrap_option(f):
    """``--bootstrap HOST:PORT`` ($MESH_BOOTSTRAP) and ``--creds FILE`` ($MESH_CREDS)."""
    f = creds_option(f)   # --creds FILE, checked at once, passed on as $MESH_CREDS
    return click.option("--bootstrap", "-b", default=lambda: os.environ.get("MESH_BOOTSTRAP", DEFAULT_BOOTSTRAP),
                        show_default="$MESH_BOOTSTRAP or 127.0.0.1:7101", help="any broker HOST:PORT")(f)


def friendly(f):
    """MeshError and bad input (ValueError, OSError, CredsError) as one line and exit code 1;
    a closed pipe on stdout ends the command quietly."""
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        try:
            return f(*args, **kwargs)
        except MeshError as exc:
            click.echo(f"error: {exc.code.name}: {exc.message}", err=True)
            sys.exit(1)
        except BrokenPipeError:
            # the reader went away (`mesh topic describe orders | head`): not an error of ours;
            # Python's advice: point stdout at devnull so the exit's flush does not fail again
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(0)
        except (ValueError, OSError) as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(1)
    return wrapper
