"""Write a JSONL file of prompts for `shoal generate`: opening sentences of stdlib docstrings."""

from __future__ import annotations

import argparse

import orjson

from shoal.stdlib_text import stdlib_docstrings


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--count", type=int, default=64)
    args = ap.parse_args()
    with open(args.out, "wb") as f:
        for i, doc in enumerate(stdlib_docstrings(max_chars=args.count * 400)):
            if i >= args.count:
                break
            first = doc.strip().split("\n\n")[0].replace("\n", " ")
            f.write(orjson.dumps({"id": f"q{i}", "prompt": first[:400]}) + b"\n")


if __name__ == "__main__":
    main()
