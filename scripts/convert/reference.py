#!/usr/bin/env python3
"""Run llama.cpp's convert_hf_to_gguf.py on a test checkpoint, naming its pre-tokenizer if asked.

llama.cpp identifies a BPE pre-tokenizer by hashing the token ids of a fixed text, and knows
only the hashes of published vocabularies. Most tests' tokenizers are small stand-ins trained
here (scripts/convert/make_tokenizers.py) with the real families' pipelines, so their hashes
are unknown to it; for those this wrapper answers `get_vocab_base_pre` with the family's name
(the only change; everything else is the converter's own code), as `onebit convert --pre` does.
With PRE "-" the converter runs unchanged (a real vocabulary, such as the SmolLM test's).

Usage: reference.py LLAMA_CPP_DIR PRE -- CONVERTER_ARGS...
"""

import sys
from pathlib import Path

llama, pre = Path(sys.argv[1]), sys.argv[2]
assert sys.argv[3] == "--"
sys.argv = [str(llama / "convert_hf_to_gguf.py")] + sys.argv[4:]
sys.path.insert(0, str(llama))
sys.path.insert(1, str(llama / "gguf-py"))

if pre != "-":
    from conversion import base  # noqa: E402

    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre

import runpy  # noqa: E402

runpy.run_path(str(llama / "convert_hf_to_gguf.py"), run_name="__main__")
