"""A byte-level BPE tokenizer trained on stdlib docstrings, for random-weight models.

Its vocabulary is exactly the model's: the trained merges, padded with reserved tokens
if the text did not yield enough, and the EOS token as the last id.
"""

from __future__ import annotations

import json

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from shoal.stdlib_text import stdlib_docstrings

EOS_TOKEN = "<|endoftext|>"


def build_tokenizer(vocab_size: int, text_chars: int, special: tuple[str, ...] = ()) -> Tokenizer:
    """`special`: more special tokens (a chat template's), placed just before EOS."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trained = vocab_size - 1 - len(special)
    trainer = trainers.BpeTrainer(
        vocab_size=trained,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(stdlib_docstrings(text_chars), trainer=trainer)
    missing = trained - tok.get_vocab_size()
    if missing > 0:
        tok = with_reserved_tokens(tok, missing)
    tok.add_special_tokens([*special, EOS_TOKEN])
    assert tok.get_vocab_size() == vocab_size and tok.token_to_id(EOS_TOKEN) == vocab_size - 1
    return tok


def with_reserved_tokens(tok: Tokenizer, count: int) -> Tokenizer:
    """`tok` with `count` reserved tokens appended to its BPE vocabulary (no merge makes
    them, so text never encodes to one). Not as added tokens: a constrained-decoding
    tokenizer (llguidance) treats those one by one, which took 154 s for the 145,000 a
    random Qwen3-1.7B's vocabulary needs, against half a second for vocabulary entries."""
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    first = len(vocab)
    vocab.update({f"<|reserved_{i}|>": first + i for i in range(count)})
    return Tokenizer.from_str(json.dumps(spec))


WORDPIECE_SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def build_wordpiece(text_chars: int, vocab_size: int = 30522) -> Tokenizer:
    """A BERT-style WordPiece tokenizer (lower-cased, [CLS] text [SEP]) trained on stdlib
    docstrings: what a random-weight encoder takes where no real encoder's tokenizer is
    at hand (a bare GPU machine). Its vocabulary is what the text yields, up to `vocab_size`."""
    from tokenizers import normalizers, processors

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=list(WORDPIECE_SPECIAL),
                                        show_progress=False)
    tok.train_from_iterator(stdlib_docstrings(text_chars), trainer=trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                       special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    return tok
