"""Reading an embedding job's corpus: JSONL or Parquet files, one row per text.

A row is an object with a text field (default "text"), an optional id field (default
"id"; a string or an integer, kept as a string; without one a row is named
`<file>:<line>`), and, with `partition_by`, the column that names its partition.
Without `partition_by` each file is a partition named by its file name's stem.

A bad row (not JSON, not an object, no text, a text that is not a string, ...) is an
error that names its file and line: with on_error="fail" it stops the job before
anything runs, with "skip" it is counted, reported, and left out. A missing or
unreadable file always stops the job.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from shoal.generate_input import InputError

MAX_REPORTED_ERRORS = 20


@dataclass(frozen=True)
class CorpusSpec:
    inputs: tuple[str, ...]
    partition_by: str = ""
    text_field: str = "text"
    id_field: str = "id"
    on_error: str = "fail"  # "fail" | "skip"

    def __post_init__(self):
        if not self.inputs:
            raise InputError("an embedding job needs at least one input file")
        if self.on_error not in ("fail", "skip"):
            raise InputError(f"on_error must be 'fail' or 'skip', got {self.on_error!r}")
        if not self.text_field:
            raise InputError("text_field must name a field")

    def to_dict(self) -> dict:
        return {"inputs": list(self.inputs), "partition_by": self.partition_by, "text_field": self.text_field,
                "id_field": self.id_field, "on_error": self.on_error}

    @classmethod
    def from_dict(cls, d: dict) -> "CorpusSpec":
        inputs = d.get("inputs")
        if not isinstance(inputs, list) or not all(isinstance(p, str) for p in inputs):
            raise InputError("inputs must be a list of file paths")
        return cls(tuple(inputs), str(d.get("partition_by") or ""), str(d.get("text_field") or "text"),
                   str(d.get("id_field") or "id"), str(d.get("on_error") or "fail"))


@dataclass
class CorpusReport:
    """What reading found besides the rows: bad rows (the first few, with their place)."""

    rows: int = 0
    skipped: int = 0
    errors: list[str] = field(default_factory=list)

    def bad_row(self, message: str, on_error: str) -> None:
        if on_error == "fail":
            raise InputError(message)
        self.skipped += 1
        if len(self.errors) < MAX_REPORTED_ERRORS:
            self.errors.append(message)


def _jsonl_rows(path: Path) -> Iterator[tuple[int, object]]:
    with path.open("rb") as fh:
        for n, line in enumerate(fh, 1):
            if line.strip():
                try:
                    yield n, orjson.loads(line)
                except orjson.JSONDecodeError as e:
                    yield n, InputError(f"not valid JSON ({e})")


def _parquet_rows(path: Path) -> Iterator[tuple[int, object]]:
    from shoal.generate_input import read_records

    for _, n, rec in read_records(path):
        yield n, rec


def check_inputs(spec: CorpusSpec) -> list[Path]:
    """Every input file exists and is readable; without partition_by, their stems
    (the partition names) are distinct."""
    paths, stems = [], {}
    for p in spec.inputs:
        path = Path(p)
        if not path.is_file():
            raise InputError(f"input file {p} does not exist")
        try:
            with path.open("rb"):
                pass
        except OSError as e:
            raise InputError(f"input file {p} cannot be read ({e.strerror})") from None
        if not spec.partition_by and path.stem in stems:
            raise InputError(f"input files {stems[path.stem]} and {p} would both be partition {path.stem!r}: "
                             "rename one, or name partitions by a column with partition_by")
        stems[path.stem] = p
        paths.append(path)
    return paths


def corpus_rows(spec: CorpusSpec, report: CorpusReport, on_file=None) -> Iterator[tuple[str, str, str]]:
    """(partition, id, text) for every good row, in file and line order. `on_file(name)`
    is called as each file begins (a file is a partition even if it holds no rows)."""
    for path in check_inputs(spec):
        if on_file is not None:
            on_file(path.stem)
        rows = _parquet_rows(path) if path.suffix == ".parquet" else _jsonl_rows(path)
        kind = "row" if path.suffix == ".parquet" else "line"
        for n, rec in rows:
            where = f"{path}:{kind} {n}"
            if isinstance(rec, InputError):
                report.bad_row(f"{where}: {rec}", spec.on_error)
                continue
            problem = _check_row(rec, spec)
            if problem:
                report.bad_row(f"{where}: {problem}", spec.on_error)
                continue
            rid = rec.get(spec.id_field)
            part = str(rec[spec.partition_by]) if spec.partition_by else path.stem
            report.rows += 1
            yield part, (f"{path.stem}:{n}" if rid is None else str(rid)), rec[spec.text_field]


def _check_row(rec, spec: CorpusSpec) -> str:
    if not isinstance(rec, dict):
        return f"each row must be an object with a {spec.text_field!r} field"
    text = rec.get(spec.text_field)
    if not isinstance(text, str):
        return f"{spec.text_field!r} must be a string, got {type(text).__name__}"
    rid = rec.get(spec.id_field)
    if rid is not None and (isinstance(rid, bool) or not isinstance(rid, (str, int))):
        return f"{spec.id_field!r} must be a string or an integer, got {rid!r}"
    if spec.partition_by:
        part = rec.get(spec.partition_by)
        if isinstance(part, bool) or not isinstance(part, (str, int)) or part == "":
            return f"partition column {spec.partition_by!r} must be a non-empty string or an integer, got {part!r}"
    return ""
