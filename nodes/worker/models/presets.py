"""Named shapes of random-weight test models (`shoal make-model --preset NAME`)."""

from __future__ import annotations

PRESETS: dict[str, dict] = {
    # Unit and integration tests: a forward pass costs well under a millisecond.
    "tiny": dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=512, max_position_embeddings=2048,
    ),
    # Mixture of experts (Qwen3-MoE): the tiny and small attention stacks, 8 / 16 experts, top 2.
    "moe-tiny": dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=512, max_position_embeddings=2048,
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64, norm_topk_prob=True,
    ),
    "moe-small": dict(
        hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
        num_key_value_heads=4, head_dim=64, vocab_size=32000, max_position_embeddings=4096,
        num_experts=16, num_experts_per_tok=2, moe_intermediate_size=768, norm_topk_prob=True,
    ),
    # W1-GPU's model: Qwen3-1.7B's shape (1.7B parameters, 3.4 GB in bf16).
    "qwen3-1.7b": dict(
        hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960,
    ),
    # the W1 benchmark's model: ~100M parameters.
    "small": dict(
        hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
        num_key_value_heads=4, head_dim=64, vocab_size=32000, max_position_embeddings=4096,
    ),
}

# Tokenizer training text per preset, in characters of stdlib docstrings: enough to
# learn the vocabulary, little enough to build in seconds.
TOKENIZER_TEXT_CHARS = {"tiny": 150_000, "small": 1_500_000, "moe-tiny": 150_000, "moe-small": 1_500_000,
                        "qwen3-1.7b": 1_500_000}
# The architecture a mixture-of-experts preset is written as (Qwen2-MoE on request:
# it adds a shared expert of twice the experts' width; Mixtral: Llama attention, experts
# as wide as the preset's moe_intermediate_size).
MOE_ARCHITECTURE = "Qwen3MoeForCausalLM"
MOE_ARCHITECTURES = (MOE_ARCHITECTURE, "Qwen2MoeForCausalLM", "MixtralForCausalLM")
