# The libFuzzer targets (sources in tests/fuzz/), for tests/fuzz/CMakeLists.txt and for the source-list
# check in tests/CMakeLists.txt.
set(EAGLE3_FUZZERS
  deepseek_v2_config_fuzzer.cc
  eagle3_draft_config_fuzzer.cc
  safetensors_header_fuzzer.cc
  tokenizer_fuzzer.cc)
