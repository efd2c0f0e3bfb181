#!/usr/bin/env python3
"""Writes models/tokenizer_words.json: a word-level Hugging Face tokenizer file of 512 tokens
(the cache fixtures' vocabulary), for `fusec generate --tokenizer` tests: "[UNK]" is 0, then
common English words, then "w<N>" up to 511; words split on whitespace and punctuation.

    python3 models/make_tokenizer.py [OUT.json]
"""

import json
import sys

WORDS = """the a an and or but if then of to in on at by for with from as is are was were be
been being it this that these those he she they we you i me him her them us my your our their
cat dog sat ran saw big small red blue green old new good bad hot cold day night time year way
man woman child world life hand part place case week point house home water room mother area
money story fact month lot right study book eye job word business issue side kind head far
black long little great high low own other same able last next early young important few public
. , ! ? ; :""".split()


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "models/tokenizer_words.json"
    vocab = {"[UNK]": 0}
    for word in WORDS:
        vocab.setdefault(word, len(vocab))
    n = 0
    while len(vocab) < 512:
        vocab[f"w{n}"] = len(vocab)
        n += 1
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": 0, "content": "[UNK]", "single_word": False, "lstrip": False, "rstrip": False,
             "normalized": False, "special": True}
        ],
        "normalizer": {"type": "Lowercase"},
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"},
    }
    with open(out, "w") as f:
        json.dump(tokenizer, f, indent=1)
    print(f"{out}: {len(vocab)} tokens")


if __name__ == "__main__":
    main()
