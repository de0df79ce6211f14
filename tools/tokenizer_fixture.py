#!/usr/bin/env python3
"""Writes tests/data/tokenizer/: a small byte-level BPE trained with HF `tokenizers` on Python standard
library sources, with exactly the pipeline of the built-in model's tokenizer (include/eagle3/
tokenizer.h), and cases.json, the ids `tokenizers` gives for edge cases, random strings and
snippets of held-out files, plus decode cases. tests/tokenizer_test.cc checks the C++ tokenizer
against them.

  /tmp/golden-venv/bin/python tools/tokenizer_fixture.py --out tests/data/tokenizer

With --fuzzer-json it prints instead the compact tokenizer.json that tests/fuzz/tokenizer_fuzzer.cc
embeds (vocab 320, trained on the same files).
"""
import argparse
import json
import os
import random
import sys
import sysconfig

import tokenizers
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_tokenizer  # noqa: E402

PATTERN = (r"'(?:s|t|re|ve|m|ll|d)| ?[A-Za-z_][A-Za-z0-9_]*| ?[0-9]+| ?[^ \t\n\r\f\vA-Za-z0-9_]+"
           r"|[ \t\n\r\f\v]+(?![^ \t\n\r\f\v])|[ \t\n\r\f\v]+")
EOT = "<|endoftext|>"
TRAIN_BYTES = 300_000
SEED = 7


def build_tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    return tok


def train(texts, vocab_size):
    tok = build_tokenizer()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  min_frequency=2, show_progress=False)
    tok.train_from_iterator(texts, trainer)
    return tok


def stdlib_files():
    """Top-level *.py of the standard library, sorted, UTF-8 only: (path, text)."""
    root = sysconfig.get_paths()["stdlib"]
    out = []
    for name in sorted(os.listdir(root)):
        if not name.endswith(".py"):
            continue
        path = os.path.join(root, name)
        try:
            with open(path, encoding="utf-8", newline="") as f:
                out.append((path, f.read()))
        except UnicodeDecodeError:
            continue
    return out


def split_files(files):
    """Training files: every other file, in order, until TRAIN_BYTES; the rest are held out."""
    train_set, held_out, size = [], [], 0
    for i, (path, text) in enumerate(files):
        if i % 2 == 0 and size < TRAIN_BYTES:
            train_set.append((path, text))
            size += len(text.encode("utf-8"))
        else:
            held_out.append((path, text))
    return train_set, held_out


SYNTHETIC = [
    "", " ", "  ", "\t", "\n", "\r\n", "\x0b", "\x0c", "\r", " \t\n\r\x0b\x0c",
    "x", "   x", "x   ", "  x  ", "\tx", "\t x", " \tx", "\t\tx", "\n\n\nx", "x\n\n\n", "x \n y",
    "\n\n    def f(x):\n        return x's", "\n\n    def f(x):\n        return x's  ",
    "def f():\n\treturn 1\n", "a\r\nb\r\n", "a\r\n\r\n  b", "if x:\r\n    pass\r\n",
    "0", "12345678901234567890", "x1 = 2.5e10 + 0x1F", " 123 456", "3.14159", "v2_3 _9 __init__",
    "it's", "it'S", "IT'S", "'s", "'t 're 've 'm 'll 'd", "'x", "''s", "don't we'll they're I'm",
    " 's", "x 'll", "'", "''", "'''docstring'''", "\"\"\"doc\"\"\"", "f'{x}'",
    "café", "Straße", "Ω≈ç√", "naïve résumé", "日本語のテキスト", "中文 字符", "emoji 🎉🐍 ok",
    "🎉", "e\u0301", "a\u0308\u0301b", "\u00a0", "a\u00a0b", " \u00a0 ", "\u3000x\u3000",
    "x\u2028y", "\u0085", "\u200b", "\ufeffimport os", "tab\u00a0\tmix",
    EOT, EOT + EOT, "a" + EOT, EOT + "a", " " + EOT + " ", "x = 1" + EOT + "y = 2",
    "\n" + EOT + "\n", "<|endoftext|", "<|endoftext|>>", "<<|endoftext|>", "<|end" + EOT + "oftext|>",
    "  " + EOT + "  x", "def f():" + EOT + "    pass",
    "!!!", " !!!", "(){}[]<>", "a+=b", "x->y", "# comment\n", "#!/usr/bin/env python3\n",
    "\x00\x01\x1f\x7f", "a\x00b", "\\n\\t", "~`@$%^&*", "x" * 300, " " * 70, "\n" * 40 + "x",
    "_" * 10, "__", "a_b_c_1_2_3", "ΑΒΓ αβγ", "привет мир", "مرحبا", "😀😀😀😀",
]


def random_strings(rng, count):
    """Strings over a pool that stresses every alternative of the split pattern and the BPE."""
    pool = [" ", " ", " ", "  ", "\t", "\n", "\r", "\x0b", "\x0c", "'", "'s", "'ll", "'re", "'S",
            "a", "b", "x", "def", "self", "_", "Z", "0", "1", "42", "(", ")", ":", ".", ",", "=",
            "\"", "#", "é", "ß", "Ω", "中", "🐍", "\u00a0", "\u3000", "\u0301", EOT, "<|", "|>"]
    return ["".join(rng.choice(pool) for _ in range(rng.randint(1, 40))) for _ in range(count)]


def snippets(rng, files, count):
    """Random 50-400 byte windows of the held-out files, cut at character boundaries."""
    out = []
    while len(out) < count:
        path, text = rng.choice(files)
        data = text.encode("utf-8")
        if len(data) < 60:
            continue
        length = rng.randint(50, min(400, len(data)))
        start = rng.randint(0, len(data) - length)
        end = start + length
        while start > 0 and (data[start] & 0xC0) == 0x80:
            start -= 1
        while end < len(data) and (data[end] & 0xC0) == 0x80:
            end += 1
        out.append((f"{os.path.basename(path)}[{start}:{end}]", data[start:end].decode("utf-8")))
    return out


def write_ignore_merges(tok, out, texts):
    """tokenizer_ignore_merges.json: the fixture with ignore_merges true and one more token that its
    merges never build, so that only the whole-word lookup can produce it; and its cases."""
    word = " return_value"
    doc = json.loads(tok.to_str())
    vocab = doc["model"]["vocab"]
    token = word.replace(" ", "\u0120")
    assert token not in vocab and len(tok.encode(word).ids) > 1
    vocab[token] = len(vocab)
    doc["model"]["ignore_merges"] = True
    ignoring = Tokenizer.from_str(json.dumps(doc))
    assert ignoring.encode(word).ids == [vocab[token]]
    path = os.path.join(out, "tokenizer_ignore_merges.json")
    ignoring.save(path, pretty=False)
    texts = texts + [word, "x =" + word, word + "s", "return_value", word + word, "\n" + word + "\n"]
    encode = [check_tokenizer.encode_case(ignoring, f"ignore_merges[{i}]", t)
              for i, t in enumerate(texts)]
    doc = check_tokenizer.document(ignoring, "tokenizer_ignore_merges.json", encode, [])
    doc["generator"] = "tools/tokenizer_fixture.py"
    with open(os.path.join(out, "cases_ignore_merges.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=0)
        f.write("\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="tests/data/tokenizer")
    parser.add_argument("--fuzzer-json", action="store_true")
    args = parser.parse_args()
    files = stdlib_files()
    train_set, held_out = split_files(files)
    texts = [text for _, text in train_set]
    if args.fuzzer_json:
        print(train(texts, 320).to_str(pretty=False))
        return

    tok = train(texts, 1000)
    os.makedirs(args.out, exist_ok=True)
    tokenizer_path = os.path.join(args.out, "tokenizer.json")
    tok.save(tokenizer_path, pretty=True)
    size = os.path.getsize(tokenizer_path)
    assert size < 150_000, f"{tokenizer_path} is {size} bytes"
    # The saved file must load back to the same tokenizer.
    assert Tokenizer.from_file(tokenizer_path).to_str() == tok.to_str()

    rng = random.Random(SEED)
    encode = [check_tokenizer.encode_case(tok, f"synthetic[{i}]", text)
              for i, text in enumerate(SYNTHETIC)]
    encode += [check_tokenizer.encode_case(tok, f"random[{i}]", text)
               for i, text in enumerate(random_strings(rng, 100))]
    encode += [check_tokenizer.encode_case(tok, name, text)
               for name, text in snippets(rng, held_out, 150)]
    # Decode: special tokens kept and skipped, then random sequences.
    vocab = tok.get_vocab()
    decode = []
    for ids in ([], [0], [0, 0], [vocab["a"], 0, vocab["b"]], [vocab["Ġ"], 0]):
        for skip in (False, True):
            decode.append({"ids": ids, "skip_special_tokens": skip,
                           "text": tok.decode(ids, skip_special_tokens=skip)})
    decode += check_tokenizer.decode_cases(tok, rng, 150)
    doc = check_tokenizer.document(tok, "tokenizer.json", encode, decode)
    doc["generator"] = "tools/tokenizer_fixture.py"
    doc["train_files"] = [os.path.basename(p) for p, _ in train_set]
    with open(os.path.join(args.out, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=0)
        f.write("\n")
    write_ignore_merges(tok, args.out, [case["text"] for case in encode[:60]])
    print(f"{args.out}: tokenizer.json ({size} bytes, vocab {tok.get_vocab_size()}, trained on "
          f"{len(train_set)} files), {len(encode)} encode and {len(decode)} decode cases, "
          f"tokenizers {tokenizers.__version__}")


if __name__ == "__main__":
    main()
