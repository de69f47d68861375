"""Hugging Face `transformers` as the reference for the engine's tests (test-only)."""

from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=4)
def hf_model(model_dir, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).eval()


@torch.inference_mode()
def hf_step_logits(model_dir, prompt: list[int], output: list[int], dtype=torch.float32) -> torch.Tensor:
    """Logits that predicted each output token: [len(output), vocab], one forward pass."""
    ids = torch.tensor([prompt + output[:-1]]) if output else torch.tensor([prompt])
    logits = hf_model(model_dir, dtype)(ids).logits[0].float()
    return logits[len(prompt) - 1 :]


@torch.inference_mode()
def hf_greedy(model_dir, prompt: list[int], max_new_tokens: int, dtype=torch.float32) -> list[int]:
    m = hf_model(model_dir, dtype)
    m.generation_config.eos_token_id = None  # like ignore_eos: EOS is an ordinary token here
    out = m.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                     max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()
