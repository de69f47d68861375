"""One sequence as a resumable coroutine: a program's generator plus the journal of the
results it has received.

A live generator cannot be pickled or moved, so the journal is the state: to continue a
sequence elsewhere, a fresh generator is run over the journal (`replay`) with no model
calls, and must yield the same operations in the same order. A program that yields
something else on replay is not deterministic, and that sequence fails with an error
that says so.
"""

from __future__ import annotations

import traceback

import orjson

from shoal.program import (Embed, Generate, ProgramError, ProgramSpec, Retrieve, Tokenize, result_from_dict,
                           result_to_dict)

OPERATIONS = (Generate, Embed, Retrieve, Tokenize)


class NotDeterministic(ProgramError):
    """Replay over the journal yielded a different operation than the one recorded."""


class Finished:
    """The program returned: `value` is the item's result."""

    def __init__(self, value):
        self.value = value


def _plain(d: dict) -> dict:
    # Operations compare in their wire form (tuples become lists, as after a round trip).
    return orjson.loads(orjson.dumps(d))


class SequenceCoroutine:
    def __init__(self, spec: ProgramSpec, item: dict, args: dict, seq_id=None):
        self.spec, self.item, self.args, self.seq_id = spec, item, args, seq_id
        self.journal: list[dict] = []  # {"op": op dict, "result": result dict}, oldest first
        self.current: dict | None = None  # the operation being waited on, in wire form
        self._gen = None

    @property
    def op_index(self) -> int:
        """The current operation's position in the program: part of its sampling key."""
        return len(self.journal)

    def _fail(self, what: str, e: BaseException) -> ProgramError:
        where = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
        at = f" at {where.filename.rsplit('/', 1)[-1]}:{where.lineno}" if where else ""
        return ProgramError(f"sequence {self.seq_id!r}: program {self.spec.name!r} {what}: "
                            f"{type(e).__name__}: {e}{at}")

    def _step(self, send):
        """Advances the generator; returns the next operation or Finished."""
        try:
            op = self._gen.send(send) if send is not None else next(self._gen)
        except StopIteration as stop:
            self.current = None
            return Finished(stop.value)
        except ProgramError:
            raise
        except Exception as e:
            raise self._fail("raised", e) from None
        if not isinstance(op, OPERATIONS):
            raise ProgramError(f"sequence {self.seq_id!r}: program {self.spec.name!r} yielded "
                               f"{type(op).__name__}, not an operation (Generate, Embed, Retrieve or Tokenize)")
        try:
            # A Generate made from settings built once (the generate program's) is plain
            # data already: its settings' wire form is only copied, not round-tripped.
            self.current = op.plain_dict() if isinstance(op, Generate) and op.is_plain else _plain(op.to_dict())
        except TypeError as e:  # e.g. a set or a numpy scalar in a prompt
            raise self._fail("yielded an operation that is not plain data", e) from None
        return op

    def start(self, journal: list[dict] = (), current: dict | None = None):
        """Starts the program, replaying `journal` (results it already had) without
        executing anything; returns the operation to run next, or Finished. `current`
        is the operation a checkpoint says comes next: replay must arrive at it."""
        try:
            self._gen = self.spec.fn(self.item, **self.args)
        except Exception as e:
            raise self._fail("could not start", e) from None
        if not hasattr(self._gen, "send"):
            raise ProgramError(f"sequence {self.seq_id!r}: program {self.spec.name!r} is not a generator "
                               "function (it must yield operations)")
        out = self._step(None)
        for i, entry in enumerate(journal):
            self._expect(out, i, entry["op"], "the journal")
            self.journal.append(entry)
            out = self._step(result_from_dict(entry["op"]["op"], entry["result"]))
        if current is not None:
            self._expect(out, len(journal), current, "the checkpoint")
        return out

    def _expect(self, out, index: int, recorded: dict, where: str) -> None:
        """Replay must yield what was recorded; anything else is a non-deterministic program."""
        if not isinstance(out, Finished) and self.current == recorded:
            return
        got = "returned" if isinstance(out, Finished) else f"yielded {self.current}"
        raise NotDeterministic(
            f"sequence {self.seq_id!r}: program {self.spec.name!r} is not deterministic: on replay, operation "
            f"{index} {got}, but {where} recorded {recorded} (a program must choose its operations from its "
            "item, its arguments and the results it received only)")

    def advance(self, result):
        """Feeds the current operation's result; returns the next operation or Finished."""
        if self.current is None:
            raise ProgramError(f"sequence {self.seq_id!r}: no operation is waiting for a result")
        self.journal.append({"op": self.current, "result": _plain(result_to_dict(result))})
        return self._step(result)

    def state(self) -> dict:
        """The coroutine as data (the current operation's progress is the engine's)."""
        return {"program": self.spec.name, "version": self.spec.version, "args": self.args,
                "item": self.item, "journal": self.journal, "current": self.current}
