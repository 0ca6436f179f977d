"""A tiny Hugging Face model folder to try bring-your-own-model runs on a CPU (README "Bring your own model").

``save_hf_model(folder)`` writes a 2-layer Llama causal LM (hidden 64, head size 32: vLLM's CPU attention runs it)
with random weights and a character-level fast tokenizer over the printable ASCII characters, by
``save_pretrained``: a folder like any downloaded model's, with a chat template unless ``chat_template=None`` (a
"base" model). It only has to load, decode and train; it knows nothing. A Llama, not a Qwen2: transformers 5 loads
a qwen2 folder's tokenizer as its own ``Qwen2Tokenizer``, which does not read this one.

    python -m graftzoo.tiny.hf my-model [--base]
"""
from __future__ import annotations

import string
import sys
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

#: one user turn, then the assistant's; what ``template: auto`` renders for a model with a chat template
CHAT_TEMPLATE = "{% for m in messages %}<|user|>{{ m['content'] }}\n{% endfor %}<|assistant|>"


def save_hf_model(folder, chat_template: str | None = CHAT_TEMPLATE, seed: int = 0) -> Path:
    """Write the tiny model and its tokenizer (one token per printable character) to ``folder``; return it."""
    vocab = {t: i for i, t in enumerate(["<pad>", "<eos>", "<unk>"] + sorted(set(string.printable)))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>",
                                  padding_side="left", clean_up_tokenization_spaces=False,
                                  chat_template=chat_template)
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(vocab), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                      pad_token_id=0, eos_token_id=1, bos_token_id=None, tie_word_embeddings=True)
    LlamaForCausalLM(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return Path(folder)


def main(argv: list[str]) -> int:
    args = [a for a in argv if a != "--base"]
    if len(args) != 1:
        print("usage: python -m graftzoo.tiny.hf FOLDER [--base]   (--base: no chat template)", file=sys.stderr)
        return 2
    out = save_hf_model(args[0], chat_template=None if "--base" in argv else CHAT_TEMPLATE)
    print(f"wrote a tiny Llama and its tokenizer to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
