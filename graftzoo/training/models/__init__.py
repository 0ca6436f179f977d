"""The trained model: its policy (weights, tokenizer, optimizer), FSDP2 sharding, LoRA adapters, and its loss and update loop (loss)."""
