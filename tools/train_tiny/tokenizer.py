"""The byte-level BPE tokenizer (8192 tokens, <|endoftext|> = id 0).

The spec is fixed because a C++ tokenizer reproduces it exactly: no normalizer, no post-processor,
ByteLevel decoder; pre-tokenizer = Split(PATTERN, isolated) then ByteLevel without its own regex;
BPE without byte fallback, dropout, unk, continuing-subword prefix or end-of-word suffix.
"""

import json

import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from data import EOT
from progress import log

VOCAB_SIZE = 8192
# \v is \x0b. A contraction; an identifier with an optional leading space; digits; a run of other
# non-space characters; whitespace not followed by a non-space (so the last space joins the next
# word); any remaining whitespace.
PATTERN = (r"'(?:s|t|re|ve|m|ll|d)| ?[A-Za-z_][A-Za-z0-9_]*| ?[0-9]+| ?[^ \t\n\r\f\vA-Za-z0-9_]+"
           r"|[ \t\n\r\f\v]+(?![^ \t\n\r\f\v])|[ \t\n\r\f\v]+")
DEFAULT_TRAIN_BYTES = 40 * 1000 * 1000


def empty_tokenizer():
    tok = Tokenizer(models.BPE(byte_fallback=False))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.post_processor = None
    tok.decoder = decoders.ByteLevel()
    return tok


def train_tokenizer(documents, max_bytes=DEFAULT_TRAIN_BYTES, vocab_size=VOCAB_SIZE):
    """Trains on the documents' texts in order, up to max_bytes (whole documents). vocab_size other than
    VOCAB_SIZE is for tests on small texts."""
    texts, total = [], 0
    for d in documents:
        if total >= max_bytes:
            break
        texts.append(d.text)
        total += len(d.text.encode("utf-8"))
    tok = empty_tokenizer()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), min_frequency=2,
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    check_spec(tok, vocab_size)
    log(f"tokenizer: trained on {len(texts)} files, {total / 1e6:.1f} MB; vocab {tok.get_vocab_size()}")
    return tok, {"files": len(texts), "bytes": total}


def check_spec(tok, vocab_size=VOCAB_SIZE):
    """The saved JSON states exactly the spec the C++ tokenizer implements."""
    spec = json.loads(tok.to_str())
    problems = []
    if tok.get_vocab_size() != vocab_size:
        problems.append(f"vocab size {tok.get_vocab_size()} != {vocab_size}")
    if tok.token_to_id(EOT) != 0:
        problems.append(f"{EOT} has id {tok.token_to_id(EOT)}, expected 0")
    if spec["normalizer"] is not None or spec["post_processor"] is not None:
        problems.append("normalizer/post_processor must be null")
    if spec["decoder"]["type"] != "ByteLevel":
        problems.append(f"decoder {spec['decoder']['type']}")
    pre = spec["pre_tokenizer"] or {}
    if pre.get("type") != "Sequence" or len(pre.get("pretokenizers", [])) != 2:
        raise SystemExit(f"tokenizer spec: pre-tokenizer {pre} is not Sequence([Split, ByteLevel])")
    split, byte_level = pre["pretokenizers"]
    if split["type"] != "Split" or split["pattern"] != {"Regex": PATTERN} or split["behavior"] != "Isolated" \
            or split["invert"]:
        problems.append(f"split pre-tokenizer {split}")
    if byte_level != {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}:
        problems.append(f"byte-level pre-tokenizer {byte_level}")
    model = spec["model"]
    for key, want in (("type", "BPE"), ("dropout", None), ("unk_token", None), ("continuing_subword_prefix", None),
                      ("end_of_word_suffix", None), ("byte_fallback", False)):
        if model.get(key) != want:
            problems.append(f"model.{key} = {model.get(key)!r}, expected {want!r}")
    if [t["content"] for t in spec["added_tokens"]] != [EOT]:
        problems.append(f"added tokens {spec['added_tokens']}")
    if problems:
        raise SystemExit("tokenizer spec: " + "; ".join(problems))


def encode_documents(tok, documents):
    """Token ids of each document (int32 arrays), encoded in parallel batches."""
    out = []
    batch = 512
    for i in range(0, len(documents), batch):
        encodings = tok.encode_batch([d.text for d in documents[i:i + batch]], add_special_tokens=False)
        out.extend(np.asarray(e.ids, dtype=np.int32) for e in encodings)
    return out
