"""Reading job input: records `{"id", ...}` from JSONL lines or Parquet rows; for the
`generate` program `{"id", "prompt" | "prompt_token_ids" | "messages", [settings]}`
("messages": a chat, rendered with the model's chat template on the worker; the settings
are the request contract's fields, `shoal/request_settings.py`, each over the job's).

Every problem is reported with its place (file and line, or upload and line) before
any work starts. The same checks run in the CLI (on the user's file) and on the storage
node (on an upload or a file referenced by path), so a job that starts is well formed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson

from shoal.protocol.errors import ShoalError
from shoal.protocol.generation_settings import own_settings
from shoal.request_settings import SettingsError, check_fits  # at the top: imported per item they cost ~13% of a check
from shoal.seen_ids import SeenIds


UTF8_BOM = b"\xef\xbb\xbf"


class InputError(ShoalError, ValueError):
    """Bad job input; the message names the file and line."""


# The largest item a job takes, as stored (compact JSON). Items travel to workers inside
# message headers (capped at 1 MiB, `protocol/codec.py`), with their checkpoints beside
# them: an item near the cap could never be delivered, and once stalled a whole job.
MAX_ITEM_BYTES = 256 << 10


@dataclass(frozen=True)
class GenerateItem:
    id: object
    prompt: str | None
    prompt_token_ids: list[int] | None
    max_tokens: int | None
    sampling: dict | None = None  # the item's own settings (max_tokens apart)
    messages: list[dict] | None = None

    def to_record(self) -> dict:
        rec = {"id": self.id}
        if self.prompt is not None:
            rec["prompt"] = self.prompt
        elif self.messages is not None:
            rec["messages"] = self.messages
        else:
            rec["prompt_token_ids"] = self.prompt_token_ids
        if self.max_tokens is not None:
            rec["max_tokens"] = self.max_tokens
        rec.update(self.sampling or {})
        return rec


def check_item_settings(rec: dict, where: str) -> dict:
    """The item's own settings (max_tokens apart), refused as the CLI refuses the same
    flags; the request contract (shoal/request_settings.py) does every check."""
    from shoal.request_settings import SettingsError, check_item

    try:
        own = check_item(rec)
    except SettingsError as e:
        raise InputError(f"{where}: {e}") from None
    own.pop("max_tokens", None)
    return own


def prompt_problem(prompt: str | None, ids: list | None, vocab_size: int | None = None) -> str | None:
    """What the worker would refuse in a prompt, said before the job starts: an empty
    one, or a token id outside the vocabulary (where its size is known)."""
    if prompt is not None and not prompt:
        return "empty prompt"
    if ids is not None:
        if not ids:
            return "empty prompt_token_ids"
        bad = next((t for t in ids if t < 0 or (vocab_size is not None and t >= vocab_size)), None)
        if bad is not None:
            return (f"token id {bad} outside the vocabulary [0, {vocab_size})" if vocab_size is not None
                    else f"token id {bad} is negative")
    return None


MAX_SETTINGS_KEPT = 1024  # distinct settings remembered as passed; past that, each is checked


def settings_key(own: dict) -> bytes | None:
    """Settings as canonical JSON (None where they are not JSON: checked every time; a
    NaN or an infinity too, which JSON would write as null)."""
    if any(isinstance(v, float) and not math.isfinite(v) for v in own.values()):
        return None
    try:
        return orjson.dumps(own, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return None


class ItemChecker:
    """Checks records one by one, remembering ids to refuse duplicates. Items of the
    `generate` program are checked field by field; those of other programs need an id
    and, if they carry program arguments, an "args" object (the program reads the rest)."""

    def __init__(self, program: str = "generate", max_item_bytes: int = MAX_ITEM_BYTES, max_context: int | None = None,
                 job=None, vocab_size: int | None = None):
        """`max_context`: the model's context in tokens, where the checker knows it: an
        item whose max_tokens cannot fit in it is refused. `job`: the job's
        GenerationSettings, where the checker knows them (the CLI): each item is then
        checked with the settings it will run with, relations between fields included."""
        self.program = program
        self.job = job
        self.vocab_size = vocab_size  # where known (the CLI): token ids past it are refused
        self.max_item_bytes = max_item_bytes
        self.max_context = max_context
        self.seen = SeenIds()  # id -> its first line, in little memory (a million ids: ~125 KB)
        # Settings that passed, by their JSON: a job's items repeat a few settings, and
        # checking them through the request contract was most of a 1M-item ingest.
        self.settings_passed: dict[bytes, tuple[dict, int | None]] = {}
        from shoal.program import built_in_item_check  # loads the built-in programs: only when checking

        self.item_check = built_in_item_check(program)  # None for a program without one

    def record(self, rec, where: str, place: int) -> dict:
        """The item as it is stored for its job."""
        if self.program == "generate":
            return self.check(rec, where, place).to_record()
        self._check_size(rec, where)
        self._check_id(rec, where, place)
        problem = self.item_check(rec, where) if self.item_check else None
        if problem:
            raise InputError(problem)
        if not isinstance(rec.get("args", {}), dict):
            raise InputError(f"{where}: args must be an object (the program's keyword arguments)")
        self._take_id(rec, place)
        return rec

    def _check_id(self, rec, where: str, place: int) -> None:
        """Refuses a missing, ill-typed or repeated id; `_take_id` records it once the
        whole item passed (a refused line does not claim its id)."""
        if not isinstance(rec, dict) or "id" not in rec:
            raise InputError(f"{where}: each line must be an object with an \"id\"")
        rid = rec["id"]
        if not isinstance(rid, (str, int)) or isinstance(rid, bool):
            raise InputError(f"{where}: id must be a string or an integer, got {rid!r}")
        if rid in self.seen:
            raise InputError(f"{where}: duplicate id {rid!r} (first on line {self.seen.place(rid)})")

    def _take_id(self, rec: dict, place: int) -> None:
        self.seen.add(rec["id"], place)

    def _check_settings(self, rec: dict, where: str, mt: int | None, prompt_tokens: int) -> dict:
        """The item's own settings (max_tokens apart), checked alone and as the item will
        run with them (the job's under its own, where the job's are known), then against
        the model's context, through the request contract."""
        key = settings_key(own_settings(rec))
        passed = self.settings_passed.get(key) if key is not None else None
        if passed is None:
            own = check_item_settings(rec, where)
            try:
                run_mt = self.job.resolve(rec).sampling.max_tokens if self.job is not None else mt
            except SettingsError as e:
                raise InputError(f"{where}: {e}") from None
            passed = (own, run_mt)
            if key is not None and len(self.settings_passed) < MAX_SETTINGS_KEPT:
                self.settings_passed[key] = passed
        own, run_mt = passed
        if self.max_context and run_mt is not None:
            try:
                check_fits(run_mt, prompt_tokens, self.max_context)
            except SettingsError as e:
                raise InputError(f"{where}: {e}") from None
        return dict(own)

    def _check_size(self, rec, where: str) -> None:
        size = len(orjson.dumps(rec))
        if size > self.max_item_bytes:
            raise InputError(f"{where}: item of {size} bytes exceeds the limit of {self.max_item_bytes} bytes per item "
                             "(--max-item-bytes)")

    def check(self, rec, where: str, place: int) -> GenerateItem:
        self._check_id(rec, where, place)
        self._check_size(rec, where)
        rid = rec["id"]
        prompt, ids, messages = rec.get("prompt"), rec.get("prompt_token_ids"), rec.get("messages")
        if sum(x is not None for x in (prompt, ids, messages)) != 1:
            raise InputError(f"{where}: give exactly one of \"prompt\", \"prompt_token_ids\" and \"messages\"")
        if messages is not None:
            from shoal.chat_template import check_messages

            problem = check_messages(messages, where)
            if problem:
                raise InputError(problem)
        if prompt is not None and not isinstance(prompt, str):
            raise InputError(f"{where}: prompt must be a string")
        if ids is not None and not (isinstance(ids, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in ids)):
            raise InputError(f"{where}: prompt_token_ids must be a list of integers")
        problem = prompt_problem(prompt, ids, self.vocab_size)
        if problem:
            raise InputError(f"{where}: {problem}")
        mt = rec.get("max_tokens")
        if mt is not None and (not isinstance(mt, int) or isinstance(mt, bool) or mt <= 0):
            raise InputError(f"{where}: max_tokens must be a positive integer, got {mt!r}")
        own = self._check_settings(rec, where, mt, len(ids or ()))
        item = GenerateItem(rid, prompt, ids, mt, own, messages)
        self._take_id(rec, place)
        return item


def parse_jsonl(lines: Iterable[bytes], name: str, keep_going: bool = False) -> Iterator[tuple[str, int, object]]:
    """(where, line number, record) for every non-blank line; a bad line raises with its
    place (with `keep_going`, its InputError comes in place of the record)."""
    for lineno, line in enumerate(lines, 1):
        if lineno == 1 and line.startswith(UTF8_BOM):  # what some editors write first: not part of the JSON
            line = line[len(UTF8_BOM):]
        if not line.strip():
            continue
        where = f"{name}:{lineno}"
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError as e:
            rec = InputError(f"{where}: not valid JSON ({e})")
            if not keep_going:
                raise rec from None
        yield where, lineno, rec


def read_records(path: str | Path, keep_going: bool = False) -> Iterator[tuple[str, int, object]]:
    """Records of a JSONL file, or of a Parquet file (by its suffix), with their places
    (`keep_going`: a line that is not JSON comes as its InputError)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"input file {path} does not exist")
    if path.suffix == ".parquet":
        from shoal.extras import need

        pq = need("pyarrow.parquet", "node", "reading Parquet")
        try:
            pf = pq.ParquetFile(path)
        except Exception as e:  # pyarrow raises several kinds for a file that is not Parquet
            raise InputError(f"{path}: not a readable Parquet file ({e})") from None
        row = 0
        for batch in pf.iter_batches(batch_size=4096):
            for rec in batch.to_pylist():
                row += 1
                rec = {k: v for k, v in rec.items() if v is not None}
                yield f"{path}:row {row}", row, rec
        return
    with path.open("rb") as fh:
        yield from parse_jsonl(fh, str(path), keep_going)


def model_limits(model_dir: str | Path) -> tuple[int, int]:
    """A Hugging Face checkpoint's context length (max_position_embeddings) and vocabulary
    size, read from its config.json without loading the model (a multimodal checkpoint
    keeps them in its text_config)."""
    path = Path(model_dir) / "config.json"
    try:
        cfg = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as e:
        raise InputError(f"cannot read the model's {path}: {e}") from None
    if isinstance(cfg, dict) and isinstance(cfg.get("text_config"), dict) and "vocab_size" not in cfg:
        cfg = cfg["text_config"]
    out = []
    for name in ("max_position_embeddings", "vocab_size"):
        value = cfg.get(name) if isinstance(cfg, dict) else None
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise InputError(f"{path}: {name} must be a positive integer, got {value!r}")
        out.append(value)
    return out[0], out[1]


def read_generate_items(path: str | Path, max_item_bytes: int = MAX_ITEM_BYTES,
                        max_context: int | None = None, job=None, vocab_size: int | None = None) -> list[GenerateItem]:
    """Every item, or an InputError naming the first bad line."""
    items, _ = read_generate_items_skipping(path, max_item_bytes, max_context, skip=False, job=job,
                                            vocab_size=vocab_size)
    return items


def read_generate_items_skipping(path: str | Path, max_item_bytes: int = MAX_ITEM_BYTES,
                                 max_context: int | None = None, skip: bool = True,
                                 job=None, vocab_size: int | None = None) -> tuple[list[GenerateItem], list[dict]]:
    """The good items, and an error record for each bad line (`{"id", "line",
    "error", "finish_reason": "error"}`, id null where the line has none), in input
    order; without `skip` the first bad line raises."""
    checker = ItemChecker(max_item_bytes=max_item_bytes, max_context=max_context, job=job, vocab_size=vocab_size)
    items, errors = [], []
    for where, place, rec in read_records(path, keep_going=skip):
        try:
            if isinstance(rec, InputError):
                raise rec
            items.append(checker.check(rec, where, place))
        except InputError as e:
            if not skip:
                raise
            rid = rec.get("id") if isinstance(rec, dict) else None
            errors.append({"id": rid if isinstance(rid, (str, int)) else None, "line": place, "error": str(e),
                           "finish_reason": "error"})
    return items, errors
