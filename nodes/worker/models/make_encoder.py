"""A random-weight BERT encoder folder of any size, with a real tokenizer: for tests
and benchmarks that need the encoder's architecture and a fast run, not its quality
(e.g. the memory benchmark over millions of texts)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file


def make_encoder(out: str | Path, tokenizer_from: str | Path | None, hidden: int = 32, layers: int = 2, heads: int = 2,
                 intermediate: int = 64, max_positions: int = 512, max_seq_length: int = 128, seed: int = 0) -> Path:
    """`tokenizer_from`: an encoder folder whose tokenizer to take (MiniLM's), or None to
    train a WordPiece tokenizer on stdlib docstrings (`tokenizer_builder.build_wordpiece`)."""
    out = Path(out)
    (out / "1_Pooling").mkdir(parents=True, exist_ok=True)
    if tokenizer_from is None:
        from shoal.nodes.worker.tokenizer_builder import build_wordpiece

        tok = build_wordpiece(1_500_000)
        tok.save(str(out / "tokenizer.json"))
        vocab = tok.get_vocab_size()
        (out / "tokenizer_config.json").write_text(json.dumps({
            "tokenizer_class": "BertTokenizer", "do_lower_case": True, "unk_token": "[UNK]", "sep_token": "[SEP]",
            "pad_token": "[PAD]", "cls_token": "[CLS]", "mask_token": "[MASK]", "model_max_length": max_positions}))
    else:
        src = Path(tokenizer_from)
        shutil.copy(src / "tokenizer.json", out / "tokenizer.json")
        if (src / "tokenizer_config.json").exists():  # how transformers loads it (a trained WordPiece's)
            shutil.copy(src / "tokenizer_config.json", out / "tokenizer_config.json")
        vocab = json.loads((src / "config.json").read_text())["vocab_size"]
    g = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=g) * 0.05

    w = {"embeddings.word_embeddings.weight": rand(vocab, hidden),
         "embeddings.position_embeddings.weight": rand(max_positions, hidden),
         "embeddings.token_type_embeddings.weight": rand(2, hidden),
         "embeddings.LayerNorm.weight": torch.ones(hidden), "embeddings.LayerNorm.bias": torch.zeros(hidden)}
    for i in range(layers):
        p = f"encoder.layer.{i}."
        for name, shape in (("attention.self.query", (hidden, hidden)), ("attention.self.key", (hidden, hidden)),
                            ("attention.self.value", (hidden, hidden)), ("attention.output.dense", (hidden, hidden)),
                            ("intermediate.dense", (intermediate, hidden)), ("output.dense", (hidden, intermediate))):
            w[p + name + ".weight"], w[p + name + ".bias"] = rand(*shape), rand(shape[0])
        for ln in ("attention.output.LayerNorm", "output.LayerNorm"):
            w[p + ln + ".weight"], w[p + ln + ".bias"] = torch.ones(hidden), torch.zeros(hidden)
    save_file({k: v.contiguous() for k, v in w.items()}, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps({
        "model_type": "bert", "architectures": ["BertModel"], "hidden_size": hidden, "num_hidden_layers": layers,
        "num_attention_heads": heads, "intermediate_size": intermediate, "max_position_embeddings": max_positions,
        "vocab_size": vocab, "layer_norm_eps": 1e-12, "type_vocab_size": 2, "hidden_act": "gelu"}))
    (out / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": hidden,
                                                               "pooling_mode_mean_tokens": True}))
    (out / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length}))
    return out
