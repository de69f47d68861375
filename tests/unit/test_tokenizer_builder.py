"""The tokenizer a random-weight model is made with (`tokenizer_builder.py`)."""

from __future__ import annotations

import json

from shoal.nodes.worker.tokenizer_builder import EOS_TOKEN, build_tokenizer


def test_the_vocabulary_is_padded_in_the_bpe_model_not_as_added_tokens():
    """A vocabulary larger than the text yields is padded with reserved tokens inside
    the BPE model: as added tokens, building a constrained-decoding tokenizer over a
    1.7B-sized vocabulary took minutes. Text never encodes to a reserved token."""
    tok = build_tokenizer(3000, 20_000, ("<|im_start|>",))
    spec = json.loads(tok.to_str())
    added = [t["content"] for t in spec["added_tokens"]]
    assert added == ["<|im_start|>", EOS_TOKEN], f"more than the special tokens were added: {added[:5]}"
    assert tok.get_vocab_size() == 3000 and tok.token_to_id(EOS_TOKEN) == 2999
    reserved = tok.token_to_id("<|reserved_0|>")
    assert reserved is not None and reserved < 2998
    ids = tok.encode("plain text with <|reserved_0|> in it").ids
    assert reserved not in ids and max(ids) < reserved
    assert tok.decode([reserved]) == "<|reserved_0|>"
