"""What a command's exit status means, the same for every command.

    0    everything asked for was done
    2    refused before anything ran: a bad flag, input, setting or model folder
    3    the cluster did not answer (the message names the node)
    4    the job ran, and some of its items failed (the count and a file to read
         them in are named); `--allow-failures` makes this 0
    130  interrupted (Ctrl-C, SIGTERM, SIGHUP)

A script that runs `shoal generate` in a pipeline must not read "3 sequences, 3 failed"
as success: the failures are in the output, and the status says so.
"""

from __future__ import annotations

import sys

OK, REFUSED, UNREACHABLE, ITEMS_FAILED, INTERRUPTED = 0, 2, 3, 4, 130


def add_allow_failures(parser) -> None:
    parser.add_argument("--allow-failures", action="store_true",
                        help=f"exit 0 even when some items failed (their errors are in the output); "
                             f"without it such a run exits {ITEMS_FAILED}")


def finish(failed: int, total: int, what: str, where: str, allow_failures: bool) -> int:
    """The exit status of a run whose job ended with `failed` of `total` items failed."""
    if not failed:
        return OK
    print(f"{failed} of {total} {what} failed: their errors are in {where}"
          + ("" if allow_failures else f" (exit {ITEMS_FAILED}; --allow-failures to exit 0)"), file=sys.stderr)
    return OK if allow_failures else ITEMS_FAILED
