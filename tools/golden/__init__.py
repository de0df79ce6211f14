"""The golden-fixture generator behind tools/make_golden.py (the entry point: command line, global torch
settings), one concept a module:

  fixtures.py            the fixture specs (MODELS, DRAFTS, MLA_DRAFTS) and the config.json each becomes
  weights.py             a target checkpoint's weight schema (MTP module included), its random weights,
                         and the hub names mapped onto transformers' fused experts
  checkpoint.py          deterministic safetensors writing; hub checkpoints as two shards plus the index
  quantized.py           the FP8 and INT4 hub forms: quantize, pack, write, read back, loader mistakes
  deepseek_reference.py  independent fp64 DeepSeek reference math (YaRN/RoPE, routers, target forward)
  oracle.py              the transformers oracle: version semantics, boundary hooks, direct mapping, max_rel
  tree.py                the EAGLE-2 dynamic tree build and tree fixtures
  deepseek_layers.py     MLA attention block (explicit latent cache) and MoE block of the DeepSeek drafters
  mtp.py                 DeepSeek-V3's MTP module as a drafter: reference, transformers assembly, fixtures
  target.py              builds and checks a target fixture (with its MTP fixtures); reads one back
  llama_draft.py         the Llama-style EAGLE-3 draft: reference, transformers assembly, fixture
  mla_draft.py           the MLA EAGLE-3 draft: reference, transformers assembly, fixture
  readme.py              OUT/README.md

Each module imports only modules listed above it (no cycles). Importing the package changes no global
state: make_golden.py sets one CPU thread and deterministic algorithms before anything runs.
"""
