#!/usr/bin/env python3
"""Write the small Hugging Face tokenizers that `onebit convert`'s tests use.

No model hub is reachable where these fixtures are made, and real vocabularies (150k tokens)
would make the test checkpoints' embeddings tens of MB. So each tokenizer is a byte-level BPE
trained here with the `tokenizers` library on the first chapter of Moby-Dick, with the same
pipeline as the real family it stands for: the same normalizer, pre-tokenizer regex, decoder,
post-processor, added special tokens and chat template layout as Qwen2/Qwen3 ("qwen2") and
Llama 3 ("llama3"). Only the vocabulary and merges differ.

"llama2" is a SentencePiece model (`tokenizer.model`) trained with the `sentencepiece` library as
Llama 2 and Mistral v0.1-v0.3 were: BPE with byte fallback, digits split, `<unk>`/`<s>`/`</s>` at
ids 0-2, plus one user-defined piece; its tokenizer_config.json is Llama 2's layout.

Output: crates/cli/tests/data/convert/<family>/{tokenizer.json,tokenizer_config.json}
(llama2: tokenizer.model and tokenizer_config.json).
Run from the repository root: .venv/bin/python scripts/convert/make_tokenizers.py
"""

import json
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

ROOT = Path(__file__).resolve().parents[2]
TEXT = ROOT / "crates/cli/tests/data/moby-dick-ch1.txt"
OUT = ROOT / "crates/cli/tests/data/convert"

QWEN2_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
LLAMA3_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"

QWEN_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
LLAMA3_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)


def train(split: str, vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train([str(TEXT)], trainer)
    return tok


def added(content: str, special: bool = True) -> dict:
    return {"content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": special}


def qwen2() -> None:
    tok = train(QWEN2_SPLIT, 380)
    tok.normalizer = normalizers.NFC()
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    # Qwen3 marks its reasoning tags as added but not special.
    tok.add_tokens(["<think>", "</think>"])
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {},
        "bos_token": None,
        "chat_template": QWEN_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 32768,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    write("qwen2", tok, config)


def llama3() -> None:
    tok = train(LLAMA3_SPLIT, 360)
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    tok.add_special_tokens(specials)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
        processors.TemplateProcessing(
            single="<|begin_of_text|> $A",
            pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
            special_tokens=[("<|begin_of_text|>", bos)],
        ),
    ])
    config = {
        "added_tokens_decoder": {},
        "bos_token": "<|begin_of_text|>",
        "chat_template": LLAMA3_TEMPLATE,
        "clean_up_tokenization_spaces": True,
        "eos_token": "<|eot_id|>",
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": 131072,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    write("llama3", tok, config)


def write(family: str, tok: Tokenizer, config: dict) -> None:
    out = OUT / family
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    # The added tokens as transformers lists them, so AutoTokenizer marks them the same way.
    data = json.loads((out / "tokenizer.json").read_text())
    for t in data["added_tokens"]:
        config["added_tokens_decoder"][str(t["id"])] = {k: t[k] for k in
            ("content", "lstrip", "normalized", "rstrip", "single_word", "special")}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    print(f"{family}: {tok.get_vocab_size()} tokens -> {out}")


LLAMA2_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] | trim + ' [/INST]' }}"
    "{% else %}{{ ' ' + message['content'] | trim + eos_token }}{% endif %}{% endfor %}"
)


def llama2() -> None:
    import io

    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        input=str(TEXT), model_writer=model, vocab_size=400, model_type="bpe", byte_fallback=True,
        split_digits=True, character_coverage=1.0, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        user_defined_symbols=["<sep>"], normalization_rule_name="identity", add_dummy_prefix=True,
        num_threads=1, minloglevel=2,
    )
    out = OUT / "llama2"
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.model").write_bytes(model.getvalue())
    decoder = {}
    for i, t in enumerate(["<unk>", "<s>", "</s>"]):
        decoder[str(i)] = {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                           "single_word": False, "special": True}
    config = {
        "add_bos_token": True,
        "add_eos_token": False,
        "added_tokens_decoder": decoder,
        "bos_token": "<s>",
        "chat_template": LLAMA2_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "</s>",
        "legacy": False,
        "model_max_length": 4096,
        "pad_token": None,
        "sp_model_kwargs": {},
        "tokenizer_class": "LlamaTokenizer",
        "unk_token": "<unk>",
        "use_default_system_prompt": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    print(f"llama2: {len(model.getvalue())} bytes -> {out}")


if __name__ == "__main__":
    import sys

    families = {"qwen2": qwen2, "llama3": llama3, "llama2": llama2}
    for name in sys.argv[1:] or families:
        families[name]()
