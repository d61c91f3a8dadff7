"""A tiny model that needs no hub: a randomly initialised Llama and a byte-level BPE tokenizer, made locally.

    python make_model.py OUT_DIR

Run at image build time with the image's own transformers, tokenizers and torch; vLLM then loads OUT_DIR through
its real loader (config.json, model.safetensors, tokenizer.json) as it would a real model. The weights are random:
what vLLM prints is noise, but the server starts, schedules, runs the model's real kernels on the CPUs it is given
and answers. Deterministic: the same libraries make the same bytes (a fixed seed, a fixed corpus), so the image's
layer is the same on every machine.

Sizes: hidden 128 with 4 heads is a head size of 32, the smallest vLLM's CPU attention accepts (16 is refused:
"Unsupported CPU attention configuration"); 4 query and 4 key/value heads split evenly for
``--tensor-parallel-size 2``. About 1.5 MB of float32 weights.
"""

from __future__ import annotations

import sys
from pathlib import Path

SEED = 31
VOCAB_SIZE = 512
CORPUS = [
    "The agent gives each tensor-parallel rank one book of CPUs, alone.",
    "vLLM binds its OpenMP threads to the CPUs it is given and allocates memory on their node.",
    "A book is a group of cores that share a cache; a socket holds several books.",
    "Kubernetes schedules the pod, the kubelet admits it, and containerd starts its container.",
    "The quick brown fox jumps over the lazy dog. 0123456789",
    "Hello, world! How are you today? I am a tiny random model; my words mean nothing.",
]
CHAT_TEMPLATE = ("{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant: {% endif %}")


def make(out: Path) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=["<s>", "</s>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", model_max_length=256)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)

    torch.manual_seed(SEED)
    config = LlamaConfig(hidden_size=128, num_attention_heads=4, num_key_value_heads=4, intermediate_size=256,
                         num_hidden_layers=2, vocab_size=tokenizer.get_vocab_size(),
                         max_position_embeddings=256, bos_token_id=fast.bos_token_id,
                         eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id, torch_dtype="float32")
    model = LlamaForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: make_model.py OUT_DIR", file=sys.stderr)
        return 2
    out = make(Path(argv[0]))
    for path in sorted(out.iterdir()):
        print(f"{path.name}\t{path.stat().st_size}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
