#!/usr/bin/env python3
"""tests/support/python/hf_tokenizers.py: Hugging Face `tokenizers` (in the test venv), the reference of dptrain's
tokenizer.json reader (integration.tokenizer_json).

  hf_tokenizers.py train STYLE OUT_DIR FILE...   trains a byte-level BPE tokenizer of STYLE on the files and saves
                                                 OUT_DIR/tokenizer.json
  hf_tokenizers.py check TOKENIZER SHARDS BLOCK VAL_EVERY FILE...
                                                 encodes each file on its own (add_special_tokens=False), as
                                                 `dptrain tokenize` does, deals blocks of BLOCK tokens to train and val
                                                 (every VAL_EVERY-th to val) and compares with the shards in SHARDS
                                                 (llm.c's .bin, uint16 or uint32); checks decode(encode(text)) == text
  hf_tokenizers.py folder STYLE OUT_DIR FILE...  as train, then makes OUT_DIR a model folder's tokenizer: a BOS
                                                 template (TemplateProcessing "BOS $A") for llama3 and
                                                 tokenizer_config.json naming its bos_token and eos_token
  hf_tokenizers.py jsonl FOLDER SHARDS VAL_EVERY BLOCK FILE...
                                                 the fine-tuning shards `dptrain tokenize` writes from JSON Lines,
                                                 built here with transformers' AutoTokenizer.from_pretrained(FOLDER):
                                                 each record tok(prompt) (its BOS included) + tok(completion, no
                                                 special tokens) + [eos_token_id] (or tok(text) + [eos]), masks 0 for
                                                 the BOS and prompt, 1 for the rest; every VAL_EVERY-th record to val;
                                                 compares tokens and masks with SHARDS and prints the val windows'
                                                 trained targets at BLOCK tokens a window

Styles (the pre-tokenizer patterns are the models' own):
  gpt2     ByteLevel pre-tokenizer (GPT-2's pattern), <|endoftext|>
  smollm   as gpt2, after a Digits(individual_digits) step (SmolLM's pre-tokenizer)
  smollm_gaps  as smollm, trained without the byte alphabet: the bytes the files lack have no token (as 21 of the 256
           lack one in SmolLM2's vocabulary), and tokenizers leaves them out of the text it encodes
  llama3   Split(Llama 3's pattern, isolated) then ByteLevel without its regex, ignore_merges, Llama 3's special
           tokens (<|begin_of_text|>, <|end_of_text|>, <|eot_id|>, ...)
  qwen2    the NFC normalizer, Split(Qwen2's pattern) then ByteLevel without its regex, <|endoftext|>, <|im_start|>,
           <|im_end|>
"""
import glob
import json
import os
import sys
import unicodedata

import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
          r"\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
         r"\s+(?!\S)|\s+")


def train(style, out, files):
    if style in ("gpt2", "smollm", "smollm_gaps"):
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        if style.startswith("smollm"):
            tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                         pre_tokenizers.ByteLevel(add_prefix_space=False)])
        special = ["<|endoftext|>"]
    elif style in ("llama3", "qwen2"):
        tok = Tokenizer(models.BPE(ignore_merges=style == "llama3"))
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3 if style == "llama3" else QWEN2), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        special = (["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
                   if style == "llama3" else ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
        if style == "qwen2":
            tok.normalizer = normalizers.NFC()
    else:
        raise SystemExit(f"unknown style {style}")
    tok.decoder = decoders.ByteLevel()
    # smollm_gaps: without the byte alphabet, so the vocabulary lacks the bytes the files lack (as SmolLM2's lacks 21)
    alphabet = [] if style == "smollm_gaps" else pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=900, special_tokens=special, initial_alphabet=alphabet,
                                  show_progress=False)
    tok.train(files, trainer)
    os.makedirs(out, exist_ok=True)
    tok.save(os.path.join(out, "tokenizer.json"))
    print(f"{style}: {tok.get_vocab_size()} ids")


def folder(style, out, files):
    train(style, out, files)
    tok = Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
    if style == "llama3":
        bos, eos = "<|begin_of_text|>", "<|end_of_text|>"
        tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                           special_tokens=[(bos, tok.token_to_id(bos))])
        tok.save(os.path.join(out, "tokenizer.json"))
    else:
        bos = eos = "<|endoftext|>"
    # eos_token as older transformers write it (an AddedToken object), bos_token as a string: dptrain reads both.
    eos_token = {"__type": "AddedToken", "content": eos, "lstrip": False, "normalized": False, "rstrip": False,
                 "single_word": False, "special": True}
    json.dump({"bos_token": bos, "eos_token": eos_token, "model_max_length": 4096,
               "tokenizer_class": "PreTrainedTokenizerFast"}, open(os.path.join(out, "tokenizer_config.json"), "w"))


def read_mask(path, n):
    raw = open(path, "rb").read()
    header = np.frombuffer(raw[:12], dtype=np.int32)
    assert int(header[0]) == 20251126 and int(header[1]) == 1 and int(header[2]) == n, (path, header)
    return np.unpackbits(np.frombuffer(raw[1024:], dtype=np.uint8), bitorder="little")[:n].astype(np.int64)


def jsonl(folder_, shards, val_every, block, files):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(folder_)
    prefix = tok("")["input_ids"]  # the BOS its template adds, or nothing
    want = {"train": ([], []), "val": ([], [])}
    d = 0
    for f in files:
        for line in open(f, encoding="utf-8"):
            if not line.strip():
                continue
            r = json.loads(line)
            if "text" in r:
                ids = tok(r["text"])["input_ids"]
                bits = [0] * len(prefix) + [1] * (len(ids) - len(prefix))
            else:
                p = tok(r["prompt"])["input_ids"]
                c = tok(r["completion"], add_special_tokens=False)["input_ids"]
                ids, bits = p + c, [0] * len(p) + [1] * len(c)
            ids, bits = ids + [tok.eos_token_id], bits + [1]
            split = "val" if d % val_every == val_every - 1 else "train"
            want[split][0].extend(ids)
            want[split][1].extend(bits)
            d += 1
    ok = True
    for split in ("train", "val"):
        paths = sorted(glob.glob(os.path.join(shards, f"*_{split}_*.bin")))
        got = np.concatenate([read_shard(p) for p in paths])
        got_bits = np.concatenate([read_mask(p[:-4] + ".mask", len(read_shard(p))) for p in paths])
        w, wb = np.array(want[split][0], dtype=np.int64), np.array(want[split][1], dtype=np.int64)
        if got.shape != w.shape or not (got == w).all() or not (got_bits == wb).all():
            print(f"BAD {split}: {len(got)} tokens ({int(got_bits.sum())} trained), transformers gives {len(w)} "
                  f"({int(wb.sum())} trained)")
            ok = False
        else:
            print(f"ok {split}: {len(got)} tokens and their {int(got_bits.sum())} trained bits equal transformers'")
        if split == "val":
            windows = (len(w) - 1) // block
            print(f"val targets {sum(int(wb[k * block + 1:k * block + block + 1].sum()) for k in range(windows))}")
    return ok


def read_shard(path):
    raw = open(path, "rb").read()
    header = np.frombuffer(raw[:1024], dtype=np.int32)
    dtype = {20240520: np.uint16, 20240801: np.uint32}[int(header[0])]
    return np.frombuffer(raw[1024:], dtype=dtype).astype(np.int64)


def check(tokenizer, shards, block, val_every, files):
    tok = Tokenizer.from_file(tokenizer)
    # A vocabulary without some bytes' tokens leaves those bytes out: decode(encode) is then not the text.
    lossless = all(c in tok.get_vocab() for c in pre_tokenizers.ByteLevel.alphabet())
    ids = []
    for f in files:
        text = open(f, "rb").read().decode("utf-8")
        enc = tok.encode(text, add_special_tokens=False).ids
        back = tok.decode(enc, skip_special_tokens=False)
        assert not lossless or back == (unicodedata.normalize("NFC", text) if tok.normalizer else text), \
            f"{f}: decode(encode) differs"
        ids.extend(enc)
    want = {"train": [], "val": []}
    for b in range(0, len(ids), block):
        want["val" if (b // block) % val_every == val_every - 1 else "train"].extend(ids[b:b + block])
    ok = True
    for split in ("train", "val"):
        got = np.concatenate([read_shard(p) for p in sorted(glob.glob(os.path.join(shards, f"*_{split}_*.bin")))])
        w = np.array(want[split], dtype=np.int64)
        if got.shape != w.shape or not (got == w).all():
            n = min(len(got), len(w))
            first = int(np.argmax(got[:n] != w[:n])) if (got[:n] != w[:n]).any() else n
            print(f"BAD {split}: {len(got)} tokens, tokenizers gives {len(w)}; first difference at {first}: "
                  f"dptrain {got[first:first + 8].tolist()} tokenizers {w[first:first + 8].tolist()}")
            ok = False
        else:
            print(f"ok {split}: {len(got)} tokens equal tokenizers'")
    return ok


if __name__ == "__main__":
    if sys.argv[1] == "train":
        train(sys.argv[2], sys.argv[3], sys.argv[4:])
    elif sys.argv[1] == "folder":
        folder(sys.argv[2], sys.argv[3], sys.argv[4:])
    elif sys.argv[1] == "jsonl":
        sys.exit(0 if jsonl(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6:]) else 1)
    elif sys.argv[1] == "check":
        sys.exit(0 if check(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6:]) else 1)
    else:
        raise SystemExit(__doc__)
