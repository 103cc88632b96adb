"""Tokenizer throughput: zerod's encode on N threads (zerod_tokenizer_probe bench) against Hugging
Face tokenizers' encode_batch_fast on N threads (RAYON_NUM_THREADS), on the same texts with the same
tokenizer: a byte-level BPE with GPT-2's pattern (and one with Llama 3's) trained here on this
project's text. Prints MB/s, tokens/s and the ratio. Both sides start with a warm word cache.

  tokenizer_bench.py PROBE SOURCE_DIR WORK_DIR THREADS
"""
import json
import os
import subprocess
import sys
import time

PROBE, SOURCE, WORK, THREADS = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
os.environ["RAYON_NUM_THREADS"] = str(THREADS)  # read when tokenizers starts its pool
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402


LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
          r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def corpus():
    files = subprocess.run(["git", "-C", SOURCE, "ls-files"], capture_output=True, text=True,
                           check=True).stdout.split()
    text = []
    for f in sorted(files):
        if f.endswith((".cc", ".h", ".md", ".py", ".sh", ".json")):
            try:
                with open(os.path.join(SOURCE, f), encoding="utf-8") as fh:
                    text.append(fh.read())
            except (UnicodeDecodeError, FileNotFoundError):
                pass
    return "".join(text)


def write_texts(path, texts):
    import struct
    with open(path, "wb") as f:
        f.write(struct.pack("<I", len(texts)))
        for t in texts:
            b = t.encode()
            f.write(struct.pack("<I", len(b)))
            f.write(b)


def main():
    os.makedirs(WORK, exist_ok=True)
    text = corpus()
    corpus_file = os.path.join(WORK, "corpus.txt")
    with open(corpus_file, "w", encoding="utf-8") as f:
        f.write(text)
    docs = [text[i:i + 4000] for i in range(0, len(text), 4000)]
    texts_file = os.path.join(WORK, "texts.bin")
    write_texts(texts_file, docs)
    nbytes = sum(len(d.encode()) for d in docs)
    for name, pre in (("gpt2", pre_tokenizers.ByteLevel(add_prefix_space=False)),
                      ("llama3", pre_tokenizers.Sequence([
                          pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated"),
                          pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]))):
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre
        tok.decoder = decoders.ByteLevel()
        tok.train([corpus_file], trainers.BpeTrainer(
            vocab_size=16000, show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
        path = os.path.join(WORK, f"{name}.json")
        tok.save(path)
        # encode_batch_fast (tokenizers >= 0.21) skips the offsets, as zerod does.
        encode = getattr(tok, "encode_batch_fast", tok.encode_batch)
        encode(docs)  # warm
        best = None
        for _ in range(3):
            t0 = time.perf_counter()
            enc = encode(docs, add_special_tokens=False)
            s = time.perf_counter() - t0
            best = s if best is None else min(best, s)
        tokens = sum(len(e.ids) for e in enc)
        runs = [json.loads(subprocess.run([PROBE, "bench", path, texts_file, str(THREADS)],
                                          capture_output=True, text=True, check=True).stdout)
                for _ in range(3)]
        z = min(runs, key=lambda r: r["seconds"])
        hf_mb = nbytes / best / 1e6
        print(f"{name}: {len(docs)} texts, {nbytes / 1e6:.1f} MB, {THREADS} threads: "
              f"zerod {z['mb_s']:.1f} MB/s {z['tokens_s'] / 1e6:.2f} M tokens/s; "
              f"HF tokenizers {hf_mb:.1f} MB/s {tokens / best / 1e6:.2f} M tokens/s; "
              f"zerod / HF {z['mb_s'] / hf_mb:.2f}", flush=True)
        if z["tokens"] != tokens:
            print(f"{name}: token counts differ ({z['tokens']} vs {tokens})", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
