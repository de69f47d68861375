"""A byte-level BPE tokenizer trained on stdlib docstrings, for random-weight models.

Its vocabulary is exactly the model's: the trained merges, padded with reserved tokens
if the text did not yield enough, and the EOS token as the last id.
"""

from __future__ import annotations

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
        tok.add_tokens([f"<|reserved_{i}|>" for i in range(missing)])
    tok.add_special_tokens([*special, EOS_TOKEN])
    assert tok.get_vocab_size() == vocab_size and tok.token_to_id(EOS_TOKEN) == vocab_size - 1
    return tok
