"""Loom's Hugging Face tokenizer (worker/data/hf_tokenizer.h) against the `tokenizers` package,
through `loomctl data prepare --tokenizer DIR`:

Byte-level BPE tokenizers of about 1,500 tokens are trained here with `tokenizers` on a corpus
this script makes (English with contractions and numbers, code with indentation and tabs, CJK,
Cyrillic, Arabic, Devanagari, emoji, decomposed characters that NFC composes, runs of spaces and
newlines, special tokens inside the text), one for each pre-tokenizer Loom knows:

- llama3: Llama 3's Split pattern + ByteLevel(use_regex=False), NFC, ignore_merges, a
  TemplateProcessing that puts <|begin_of_text|> first, special tokens, and added tokens that
  are matched in the normalized text or take the white space around them;
- gpt2: ByteLevel(add_prefix_space=True, use_regex=True), the merges written "left right";
- qwen2: Qwen2's pattern, NFC, eos from generation_config.json;
- tekken: Mistral's pattern.

For each, documents from another draw of the corpus go through `loomctl data prepare`, and the
token file must hold exactly encode(doc, add_special_tokens=False).ids + [eos] for every
document, with the header's vocabulary size, dtype and tokenizer. Decoding is covered by the unit
tests (tests/unit/data/hf_tokenizer_test.cc), whose expected strings are `tokenizers`' own.

  python3 tests/oracles/tokenizer_test.py --bin build/bin
"""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from loom_runs import oracle_args  # noqa: E402

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers  # noqa: E402
from tokenizers import processors, trainers  # noqa: E402

import parity_test  # noqa: E402
from parity_test import check  # noqa: E402
from token_file import read_token_file  # noqa: E402

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
         r"|\s+(?!\S)|\s+")
TEKKEN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?"
          r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")
VOCAB = 1500

WORDS = ("the quick brown fox jumps over lazy dog tokenizer merges vocabulary training loss gradient batch "
         "don't I'll she's WE'RE they've I'M you'd It'S can't won't y'all o'clock rock'n'roll").split()
NUMBERS = ("7", "42", "123", "2024", "31415", "1000000", "3.14159", "0.5", "1,234,567", "10:45", "2026-12-03", "½",
           "Ⅻ", "٣٤٥")
CODE = ("def f(x):\n    return x * 2\n", "\tif (a && b) {\n\t\tc++;\n\t}\n", "for i in range(10):\n        pass\n",
        "int main() {\r\n  return 0;\r\n}\r\n", "// comment with  two  spaces\n#include <vector>\n",
        "x = [1, 2, 3]  # trailing\n\n\n", "    \n  \t \n", "path/to/file.txt /usr/bin/env -- --flag=value\n")
MULTILINGUAL = ("你好，世界！我们在训练模型。", "日本語のテキストとカタカナ。", "한국어 문장입니다", "Привет, мир! Как дела?",
                "مرحبا بالعالم، كيف حالك؟", "नमस्ते दुनिया, यह एक परीक्षण है।", "Ελληνικά γράμματα ΑΒΓ",
                "emoji 😀👍🏽 👨‍👩‍👧 ❤️ 🇫🇷", "Ǆemal ǅ ǆ ʰ ſt", "ｶﾀｶﾅ and ｆｕｌｌｗｉｄｔｈ", "x\u00a0y\u3000z\u2028w")
# Decomposed forms NFC composes (and reorders): e + acute, a + diaeresis, Hangul jamo, A + ring,
# a dot below after a dot above, a mark on its own.
COMBINING = ("cafe\u0301", "nai\u0308ve", "\u1100\u1161\u11a8\u1102\u1165", "A\u030angstro\u0308m",
             "q\u0307\u0323", "e\u0301\u0301", "\u0301start", "Cafe\u0301 \u0915\u093f")
SPACES = ("   ", "\n\n", "\n   \n", "\t\t", " \r\n", "     x", "\n\n\n\n", "  ", " \u00a0 ")
SPECIALS = ("<|begin_of_text|>", "<|end_of_text|>", "<|endoftext|>", "<|end_of", "<|im_start|>user\nhi<|im_end|>",
            "<custom>", " <mask> ", "café!", "cafe\u0301!", "Café!")


def corpus(seed, n, length):
    """n documents of about `length` pieces drawn from the lists above."""
    rng = random.Random(seed)
    pools = (WORDS, WORDS, WORDS, NUMBERS, CODE, MULTILINGUAL, COMBINING, SPACES, SPECIALS)
    docs = []
    for _ in range(n):
        pieces = []
        for _ in range(rng.randint(1, length)):
            pool = rng.choice(pools)
            pieces.append(rng.choice(pool))
            pieces.append(rng.choice(("", " ", " ", "\n", ", ", ". ")))
        docs.append("".join(pieces).rstrip() or "x")  # never blank: prepare skips blank documents
    return docs


def byte_level_bpe(split, nfc, ignore_merges, add_prefix_space=False):
    """An untrained tokenizer: Split(split) + ByteLevel(use_regex=False), or plain ByteLevel(use_regex=True) for
    split None."""
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if nfc:
        tok.normalizer = normalizers.NFC()
    if split is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    return tok


def train(tok, specials, docs):
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, min_frequency=2, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(docs, trainer)


def save(tok, directory, tokenizer_config=None, generation_config=None, legacy_merges=False):
    os.makedirs(directory)
    path = os.path.join(directory, "tokenizer.json")
    tok.save(path)
    if legacy_merges:  # older files spell each merge "left right"
        with open(path) as f:
            j = json.load(f)
        j["model"]["merges"] = [" ".join(m) for m in j["model"]["merges"]]
        with open(path, "w") as f:
            json.dump(j, f, ensure_ascii=False)
        tok = Tokenizer.from_file(path)  # what `tokenizers` makes of the file as written
    for name, content in (("tokenizer_config.json", tokenizer_config), ("generation_config.json", generation_config)):
        if content is not None:
            with open(os.path.join(directory, name), "w") as f:
                json.dump(content, f)
    return tok


def make_tokenizers(work, training_docs):
    """{name: (directory, the `tokenizers` Tokenizer as saved, the eos id)}."""
    out = {}

    tok = byte_level_bpe(LLAMA3, nfc=True, ignore_merges=True)
    train(tok, ["<|begin_of_text|>", "<|end_of_text|>"], training_docs)
    tok.add_tokens([AddedToken("cafe\u0301!", normalized=True),  # matched in NFC text as "Café!" is not, "café!" is
                    AddedToken("<custom>", normalized=False)])
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, rstrip=True)])
    template = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                             special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))])
    tok.post_processor = processors.Sequence([processors.ByteLevel(trim_offsets=False), template])
    tok = save(tok, os.path.join(work, "llama3"),
               tokenizer_config={"bos_token": "<|begin_of_text|>", "eos_token": {"content": "<|end_of_text|>"}})
    out["llama3"] = (os.path.join(work, "llama3"), tok, tok.token_to_id("<|end_of_text|>"))

    tok = byte_level_bpe(None, nfc=False, ignore_merges=False, add_prefix_space=True)
    train(tok, ["<|endoftext|>"], training_docs)
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    tok = save(tok, os.path.join(work, "gpt2"), tokenizer_config={"eos_token": "<|endoftext|>"}, legacy_merges=True)
    out["gpt2"] = (os.path.join(work, "gpt2"), tok, tok.token_to_id("<|endoftext|>"))

    tok = byte_level_bpe(QWEN2, nfc=True, ignore_merges=False)
    train(tok, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], training_docs)
    tok = save(tok, os.path.join(work, "qwen2"), generation_config={"eos_token_id": [tok.token_to_id("<|im_end|>")]})
    out["qwen2"] = (os.path.join(work, "qwen2"), tok, tok.token_to_id("<|im_end|>"))

    tok = byte_level_bpe(TEKKEN, nfc=False, ignore_merges=False)
    train(tok, ["<s>", "</s>"], training_docs)
    tok = save(tok, os.path.join(work, "tekken"), tokenizer_config={"eos_token": "</s>"})
    out["tekken"] = (os.path.join(work, "tekken"), tok, tok.token_to_id("</s>"))
    return out


def prepare(bin_dir, work, name, directory, docs):
    data = os.path.join(work, name + ".jsonl")
    with open(data, "w") as f:
        for doc in docs:
            f.write(json.dumps({"text": doc}, ensure_ascii=False) + "\n")
    output = os.path.join(work, name + ".tokens")
    r = subprocess.run([os.path.join(bin_dir, "loomctl"), "data", "prepare", data, "--tokenizer", directory,
                        "--output", output], capture_output=True, text=True, timeout=120)
    check(r.returncode == 0, f"{name}: loomctl data prepare --tokenizer: {r.stdout.strip()} {r.stderr.strip()}")
    return output if r.returncode == 0 else None


def compare(name, directory, tok, eos, docs, output):
    header, tokens = read_token_file(output)
    expected, starts = [], []
    for doc in docs:
        starts.append(len(expected))
        expected += tok.encode(doc, add_special_tokens=False).ids + [eos]
    got = tokens.tolist()
    check(header["document_starts"] == starts, f"{name}: {len(starts)} documents start where tokenizers' do")
    same = got == expected
    if not same:  # name the first document that differs, with both encodings
        for i, doc in enumerate(docs):
            end = starts[i + 1] if i + 1 < len(starts) else len(expected)
            if got[starts[i]:end] != expected[starts[i]:end]:
                print(f"  document {i} {doc!r}:\n    loom       {got[starts[i]:end]}\n"
                      f"    tokenizers {expected[starts[i]:end]}")
                break
    check(same, f"{name}: all {len(expected)} ids equal tokenizers' encode(doc, add_special_tokens=False) + [eos]")
    # The added tokens are in the documents: the comparison covers how they are found.
    for token in ("<custom>", "<mask>", "cafe\u0301!"):
        if tok.token_to_id(token) is not None:
            check(tok.token_to_id(token) in expected, f"{name}: the documents hold the added token {token!r}")
    vocab_size = tok.get_vocab_size(with_added_tokens=True)
    check(header["vocab_size"] == vocab_size and header["dtype"] == "uint16" and header["eos_token_id"] == eos,
          f"{name}: header vocab_size {header['vocab_size']} (tokenizers: {vocab_size}), dtype {header['dtype']}, "
          f"eos {header['eos_token_id']} ({eos})")
    check(header["tokenizer"] == "hf:" + directory, f"{name}: header tokenizer {header['tokenizer']!r}")


def main():
    bin_dir = oracle_args(__doc__).bin
    work = tempfile.mkdtemp(prefix="loom-tokenizer-")
    try:
        tokenizers = make_tokenizers(work, corpus(seed=1, n=2000, length=30))
        docs = corpus(seed=2, n=300, length=40)
        for name, (directory, tok, eos) in tokenizers.items():
            output = prepare(bin_dir, work, name, directory, docs)
            if output:
                compare(name, directory, tok, eos, docs, output)
        # The template is what add_special_tokens=True adds, and data prepare leaves it out.
        directory, tok, _ = tokenizers["llama3"]
        check(tok.encode("hi", add_special_tokens=True).ids[0] == tok.token_to_id("<|begin_of_text|>"),
              "llama3: the template puts <|begin_of_text|> first (and prepare, without special tokens, does not)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return parity_test.exit_code()


if __name__ == "__main__":
    sys.exit(main())
