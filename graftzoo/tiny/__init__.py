"""Tiny models built in code (Qwen2 / GPT-2 configs with tokenizers defined in code) and their cached warm-up."""
