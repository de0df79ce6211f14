#!/usr/bin/env python3
"""Writes the expected output of HF `tokenizers` for a tokenizer.json over arbitrary text files, in the
cases.json form that tests/tokenizer_test.cc checks (see tests/data/tokenizer/README.md).

  python tools/check_tokenizer.py --tokenizer T/tokenizer.json --out /tmp/cases.json FILE...
  python tools/check_tokenizer.py --tokenizer T/tokenizer.json --out /tmp/cases.json \
      --file-list OUT/heldout_files.txt
  EAGLE3_TOKENIZER_CHECK=T/tokenizer.json:/tmp/cases.json build/tests/tokenizer_test

Each file (skipped when it is not UTF-8) becomes one encode case; --decode-cases random id sequences
(special ids included, byte tokens that do not form UTF-8 on purpose) become decode cases, with and
without skip_special_tokens.
"""
import argparse
import json
import random
import sys

import tokenizers


def encode_case(tok, name, text):
    return {"name": name, "text": text, "ids": tok.encode(text).ids}


def decode_cases(tok, rng, count, max_length=24):
    """Random id sequences; half of them drawn from the single-byte tokens, which rarely form UTF-8."""
    vocab = tok.get_vocab()
    size = tok.get_vocab_size()
    byte_ids = sorted(i for t, i in vocab.items() if len(t) == 1)
    cases = []
    for n in range(count):
        pool = byte_ids if n % 2 else range(size)
        ids = [rng.choice(pool) for _ in range(rng.randint(1, max_length))]
        for skip in (False, True):
            cases.append({"ids": ids, "skip_special_tokens": skip,
                          "text": tok.decode(ids, skip_special_tokens=skip)})
    return cases


def document(tok, tokenizer_path, encode, decode):
    return {
        "generator": "tools/check_tokenizer.py",
        "tokenizers_version": tokenizers.__version__,
        "tokenizer": tokenizer_path,
        "vocab_size": tok.get_vocab_size(),
        "encode": encode,
        "decode": decode,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--file-list", help="a file naming one input file per line")
    parser.add_argument("--decode-cases", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("files", nargs="*")
    args = parser.parse_args()
    files = list(args.files)
    if args.file_list:
        with open(args.file_list, encoding="utf-8") as f:
            files += [line.strip() for line in f if line.strip()]
    tok = tokenizers.Tokenizer.from_file(args.tokenizer)
    encode, skipped, total = [], 0, 0
    for path in files:
        try:
            with open(path, encoding="utf-8", newline="") as f:
                text = f.read()
        except (UnicodeDecodeError, OSError) as e:
            print(f"skipped {path}: {e}", file=sys.stderr)
            skipped += 1
            continue
        encode.append(encode_case(tok, path, text))
        total += len(text.encode("utf-8"))
    decode = decode_cases(tok, random.Random(args.seed), args.decode_cases)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(document(tok, args.tokenizer, encode, decode), f, ensure_ascii=False)
    print(f"{args.out}: {len(encode)} files ({total} bytes, {skipped} skipped), "
          f"{len(decode)} decode cases, tokenizers {tokenizers.__version__}")


if __name__ == "__main__":
    main()
