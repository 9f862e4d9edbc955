"""tests/integration/lib/gpt2_bpe.py: the reference for dptrain's GPT-2 BPE (data/bpe.h), in the tests' own Python.

GPT-2's encoder.py algorithm (openai/gpt-2 src/encoder.py: bytes_to_unicode, the pre-tokenizer regex through the
`regex` module, the merge loop), written again here, plus a plain count-based BPE trainer to make a small
vocabulary from a corpus. Debian's python3 with python3-regex and numpy (scripts/setup.sh --tests installs both).

  gpt2_bpe.py train DIR N_MERGES FILE...     write DIR/vocab.json and DIR/merges.txt: N_MERGES merges learnt
                                             from the FILEs (GPT-2's layout: the 256 bytes, the merges, then
                                             <|endoftext|>)
  gpt2_bpe.py check DIR SHARDS N FILE...     the shards in SHARDS (gpt2_train_*.bin, gpt2_val_*.bin; every Nth
                                             block of 4096 tokens is val) hold exactly the FILEs encoded one by one
                                             with DIR's vocabulary; also against Hugging Face `tokenizers` when it
                                             is importable
"""
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import regex

PATTERN = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
BLOCK = 4096


def bytes_to_unicode():
    """encoder.py's table: byte -> the character that stands for it."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(2**8):
        if b not in bs:
            bs.append(b)
            cs.append(2**8 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


BYTE_ENCODER = bytes_to_unicode()


def words(text):
    """The pre-tokens of a str, each as GPT-2's characters for its UTF-8 bytes."""
    for token in regex.findall(PATTERN, text):
        yield "".join(BYTE_ENCODER[b] for b in token.encode("utf-8"))


def read_text(path):
    return Path(path).read_bytes().decode("utf-8")  # the test's corpus is valid UTF-8


def train(out_dir, n_merges, files):
    counts = Counter()
    for f in files:
        counts.update(words(read_text(f)))
    vocab_words = {tuple(w): c for w, c in counts.items()}
    merges = []
    for _ in range(n_merges):
        pairs = Counter()
        for w, c in vocab_words.items():
            for pair in zip(w, w[1:]):
                pairs[pair] += c
        if not pairs:
            break
        best = max(pairs, key=lambda p: (pairs[p], p))  # the most frequent; ties by the pair itself
        merges.append(best)
        merged = {}
        for w, c in vocab_words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged[tuple(out)] = merged.get(tuple(out), 0) + c
        vocab_words = merged
    vocab = {ch: i for i, ch in enumerate(BYTE_ENCODER.values())}
    for a, b in merges:
        vocab[a + b] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (out / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges), encoding="utf-8")
    print(f"trained {len(merges)} merges on {sum(counts.values())} words: vocab {len(vocab)}")


class Encoder:
    """encoder.py's Encoder.encode, for bytes of valid UTF-8."""

    def __init__(self, vocab_dir):
        d = Path(vocab_dir)
        self.encoder = json.loads((d / "vocab.json").read_text(encoding="utf-8"))
        lines = (d / "merges.txt").read_text(encoding="utf-8").split("\n")[1:-1]
        self.bpe_ranks = {tuple(line.split()): i for i, line in enumerate(lines)}
        self.cache = {}

    def bpe(self, token):
        if token in self.cache:
            return self.cache[token]
        word = tuple(token)
        while len(word) > 1:
            pairs = set(zip(word, word[1:]))
            bigram = min(pairs, key=lambda pair: self.bpe_ranks.get(pair, float("inf")))
            if bigram not in self.bpe_ranks:
                break
            first, second = bigram
            new_word, i = [], 0
            while i < len(word):
                try:
                    j = word.index(first, i)
                except ValueError:
                    new_word.extend(word[i:])
                    break
                new_word.extend(word[i:j])
                i = j
                if word[i] == first and i < len(word) - 1 and word[i + 1] == second:
                    new_word.append(first + second)
                    i += 2
                else:
                    new_word.append(word[i])
                    i += 1
            word = tuple(new_word)
        self.cache[token] = word
        return word

    def encode(self, text):
        return [self.encoder[t] for w in words(text) for t in self.bpe(w)]


def read_shard(path):
    raw = Path(path).read_bytes()
    header = np.frombuffer(raw[:1024], dtype="<i4")
    assert header[0] == 20240520 and header[1] == 1, f"{path}: header {header[:3]}"
    toks = np.frombuffer(raw[1024:], dtype="<u2")
    assert len(toks) == header[2], f"{path}: {len(toks)} tokens, header says {header[2]}"
    return toks.astype(np.int64)


def shard_stream(shard_dir, n):
    """The train and val shards' tokens put back in corpus order (every nth block of 4096 is val)."""
    train = np.concatenate([read_shard(p) for p in sorted(Path(shard_dir).glob("gpt2_train_*.bin"))])
    val = np.concatenate([read_shard(p) for p in sorted(Path(shard_dir).glob("gpt2_val_*.bin"))])
    out, t, v, i = [], 0, 0, 0
    while t < len(train) or v < len(val):
        if i % n == n - 1:
            out.append(val[v:v + BLOCK])
            v += BLOCK
        else:
            out.append(train[t:t + BLOCK])
            t += BLOCK
        i += 1
    return np.concatenate(out), len(train), len(val)


def first_difference(a, b, what):
    m = min(len(a), len(b))
    diff = np.nonzero(np.asarray(a[:m]) != np.asarray(b[:m]))[0]
    i = int(diff[0]) if len(diff) else m
    raise SystemExit(f"FAIL: {what}: {len(a)} vs {len(b)} tokens, first difference at token {i}: "
                     f"{list(a[max(0, i - 3):i + 5])} vs {list(b[max(0, i - 3):i + 5])}")


def check(vocab_dir, shard_dir, n, files):
    enc = Encoder(vocab_dir)
    texts = [read_text(f) for f in files]
    ref = np.array([t for text in texts for t in enc.encode(text)], dtype=np.int64)
    got, n_train, n_val = shard_stream(shard_dir, n)
    if len(got) != len(ref) or (got != ref).any():
        first_difference(got, ref, "dptrain's shards vs the encoder.py reference")
    nbytes = sum(len(t.encode("utf-8")) for t in texts)
    print(f"ok: {len(ref)} tokens ({n_train} train + {n_val} val) from {nbytes} bytes in {len(files)} files, "
          f"the same as encoder.py's")
    try:
        from tokenizers import ByteLevelBPETokenizer
    except ImportError:
        print("skipped: Hugging Face tokenizers is not importable (pip install tokenizers): encoder.py only")
        return
    hf = ByteLevelBPETokenizer(str(Path(vocab_dir) / "vocab.json"), str(Path(vocab_dir) / "merges.txt"))
    hf_ids = np.array([t for text in texts for t in hf.encode(text).ids], dtype=np.int64)
    if len(hf_ids) != len(ref) or (hf_ids != ref).any():
        first_difference(got, hf_ids, "dptrain's shards vs Hugging Face tokenizers")
    print(f"ok: the same {len(hf_ids)} tokens as Hugging Face tokenizers' ByteLevelBPETokenizer")


def main(argv):
    if len(argv) >= 4 and argv[1] == "train":
        train(argv[2], int(argv[3]), argv[4:])
    elif len(argv) >= 5 and argv[1] == "check":
        check(argv[2], argv[3], int(argv[4]), argv[5:])
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
