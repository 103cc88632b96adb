"""Tokenizer parity: zerod's tokenizers (zerod_tokenizer_probe) against Hugging Face tokenizers
and sentencepiece (Debian's python3-sentencepiece: the same library version zerod links), on
tokenizers this script trains itself (no downloads).

  parity.py PROBE WORK_DIR SOURCE_DIR

Assembles a corpus of at least 5 MB (the project's own sources and docs, generated text in many
scripts with emoji, combining marks, whitespace runs, digits, code, special-token strings, and
every code point Unicode 14 assigns), trains

  gpt2        byte-level BPE with GPT-2's pattern (ByteLevel use_regex), tokenizer.json
  gpt2-files  the same as GPT-2's vocab.json + merges.txt
  llama3      byte-level BPE behind a Split with Llama 3's pattern, ignore_merges, added tokens
              with lstrip/rstrip, a BOS template
  qwen2       byte-level BPE behind Qwen2's NFC normalizer and Split pattern, with its special
              tokens; the same file with the NFD, NFKC and NFKD normalizers (qwen2-nfd, ...)
  llama2      SentencePiece-style BPE with byte_fallback: Prepend + Replace normalizer, the
              Replace/ByteFallback/Fuse/Strip decoder (Llama 2, Mistral), a BOS template
  metaspace   the same model behind the older Metaspace pre-tokenizer and decoder
  sp-unigram  a sentencepiece unigram .model
  sp-bpe      a sentencepiece BPE .model with byte_fallback

and requires for each: identical ids for every text (and with BOS/EOS where the file has a
template), identical decode of the reference ids, and for the byte-level ones decode(encode(x))
== x on texts with invalid UTF-8 (C++ only: the Python libraries take str). Exits 1 on any
mismatch, printing the first few.
"""
import json
import os
import random
import struct
import subprocess
import sys
import time
import unicodedata

import sentencepiece as spm
from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                        pre_tokenizers, processors, trainers)

PROBE, WORK, SOURCE = sys.argv[1], sys.argv[2], sys.argv[3]
os.makedirs(WORK, exist_ok=True)
rng = random.Random(20)

# Qwen2's: Llama 3's with single digits.
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# ----------------------------------------------------------------------------------------------
# The corpus


def project_text():
    files = subprocess.run(["git", "-C", SOURCE, "ls-files"], capture_output=True, text=True,
                           check=True).stdout.split()
    parts = []
    for f in sorted(files):
        if f.endswith((".cc", ".h", ".cu", ".md", ".py", ".sh", ".txt", ".json", ".cmake",
                       ".proto", ".yaml")):
            try:
                with open(os.path.join(SOURCE, f), encoding="utf-8") as fh:
                    parts.append(fh.read())
            except (UnicodeDecodeError, FileNotFoundError):
                pass
    return parts


SCRIPTS = {  # inclusive code point ranges of letters
    "latin": [(0x41, 0x5A), (0x61, 0x7A), (0xC0, 0x24F)], "greek": [(0x391, 0x3C9)],
    "cyrillic": [(0x410, 0x44F)], "armenian": [(0x531, 0x556), (0x561, 0x587)],
    "hebrew": [(0x5D0, 0x5EA)], "arabic": [(0x621, 0x64A)], "devanagari": [(0x904, 0x939)],
    "bengali": [(0x985, 0x9B9)], "tamil": [(0xB85, 0xBB9)], "thai": [(0xE01, 0xE30)],
    "georgian": [(0x10D0, 0x10FA)], "ethiopic": [(0x1200, 0x1248)], "hangul": [(0xAC00, 0xD7A3)],
    "hiragana": [(0x3041, 0x3096)], "katakana": [(0x30A1, 0x30FA)], "cjk": [(0x4E00, 0x9FFF)],
    "cherokee": [(0x13A0, 0x13F4)], "runic": [(0x16A0, 0x16EA)], "math": [(0x1D400, 0x1D4FF)],
}
EMOJI = ["😀", "🚀", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷", "🇯🇵", "❤️", "🏳️‍🌈", "🤖", "🧪", "✅", "🔥", "🐍"]
SPACES = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\u00a0", "\u3000", "\u2028",
          "\u0085", "\u180e", "\u200b", "\u2009", "\u202f", "\x0b", "\x0c", "\x1c", "    \n\t  "]
DIGITS = ["0123456789", "٠١٢٣٤٥٦٧٨٩", "०१२३४५६७८९", "０１２３４５", "Ⅻ", "½", "²³", "1,234,567.89"]
SPECIAL_STRINGS = ["<|endoftext|>", "<|begin_of_text|>", "<|end_of_text|>", " <mask> ", "<mask>",
                   "<sep>  x", "[TOOL]", "<s>", "</s>", "<unk>", "<0x41>", "<|endoftext", "<<s>>"]
CODE = ["for (int i = 0; i < n; ++i) { x[i] += y[i] * 2; }\n", "def f(x):\n    return x ** 2\n",
        "if a != b && c >= d || !e { panic!(\"{}\", e); }\n", "SELECT * FROM t WHERE id = 42;\n",
        "<div class=\"a\">&nbp;</div>\n", "x = {'k': [1, 2.5e-3, None]}\n", "$ ls -la | grep '^d'\n"]
CONTRACTIONS = ["I'm", "you're", "it's", "WE'LL", "they've", "don't", "He'D", "ſ's", "'S", "Kelvin"]


def word(script):
    lo, hi = rng.choice(SCRIPTS[script])
    out = []
    for _ in range(rng.randint(1, 9)):
        c = chr(rng.randint(lo, hi))
        if unicodedata.category(c) != "Cn":
            out.append(c)
    return "".join(out) or "a"


def generated_text(size):
    out, n = [], 0
    names = list(SCRIPTS)
    while n < size:
        kind = rng.random()
        if kind < 0.45:
            s = word(rng.choice(names))
            if rng.random() < 0.15:  # combining marks
                s += "".join(chr(rng.randint(0x300, 0x36F)) for _ in range(rng.randint(1, 3)))
        elif kind < 0.55:
            s = rng.choice(EMOJI)
        elif kind < 0.70:
            s = rng.choice(SPACES)
        elif kind < 0.78:
            s = rng.choice(DIGITS)[: rng.randint(1, 10)]
        elif kind < 0.84:
            s = rng.choice(CODE)
        elif kind < 0.90:
            s = rng.choice(CONTRACTIONS)
        elif kind < 0.93:
            s = rng.choice(SPECIAL_STRINGS)
        else:
            s = "".join(chr(rng.randint(0x21, 0x7E)) for _ in range(rng.randint(1, 6)))
        out.append(s)
        out.append(" " if rng.random() < 0.7 else "")
        n += len(s.encode()) + 1
    return "".join(out)


def all_code_points():
    """Every assigned code point (Unicode 14 by Python's unicodedata, as PCRE2 10.42 knows),
    each between letters, spaces and digits, so every class the patterns use is crossed."""
    chars = [chr(c) for c in range(1, 0x323B0)
             if not 0xD800 <= c <= 0xDFFF and unicodedata.category(chr(c)) not in ("Cn", "Co")]
    out = []
    ctx = ["a{}b", " {} ", "{}{}", "1{}2", "{}\n", " {}x", "'{}s", "{}  "]
    for i, c in enumerate(chars):
        out.append(ctx[i % len(ctx)].format(c, c))
    return "".join(out)


def make_corpus():
    parts = project_text()
    parts.append(all_code_points())
    total = sum(len(p.encode()) for p in parts)
    parts.append(generated_text(max(2_500_000, 5_300_000 - total)))
    return parts


def split_documents(parts):
    """Documents of 200 B to 8 KB cut at arbitrary characters (so texts start and end
    anywhere: mid-word, mid-whitespace run, before a combining mark)."""
    docs = []
    for p in parts:
        i = 0
        while i < len(p):
            n = rng.randint(50, 4000)
            docs.append(p[i:i + n])
            i += n
    return docs


def with_invalid_bytes(docs):
    bad = [b"\x80", b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xe2\x82", b"\xf0\x9f\x98",
           b"\xf5\x80\x80\x80", b"\xfe\xfe", b"\xc3", b"\x00"]
    out = []
    for d in docs:
        b = bytearray(d.encode())
        for _ in range(rng.randint(1, 4)):
            k = rng.randint(0, len(b))
            b[k:k] = rng.choice(bad)
        out.append(bytes(b))
    return out

# ----------------------------------------------------------------------------------------------
# Training


def byte_level_trainer(specials, vocab=8000):
    return trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials, show_progress=False,
                               initial_alphabet=pre_tokenizers.ByteLevel.alphabet())


def train_gpt2(corpus_file, d):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    tok.train([corpus_file], byte_level_trainer(["<|endoftext|>"]))
    os.makedirs(d, exist_ok=True)
    tok.save(os.path.join(d, "tokenizer.json"))
    files = os.path.join(WORK, "gpt2-files")
    os.makedirs(files, exist_ok=True)
    tok.model.save(files)  # vocab.json + merges.txt
    return tok


def train_llama3(corpus_file, d):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>"] + [f"<|reserved_{i}|>" for i in range(8)]
    tok.train([corpus_file], byte_level_trainer(specials, vocab=10000))
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True, normalized=False),
                            AddedToken("<sep>", rstrip=True, special=True, normalized=False)])
    tok.add_tokens([AddedToken("[TOOL]", special=False)])
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos)])
    os.makedirs(d, exist_ok=True)
    tok.save(os.path.join(d, "tokenizer.json"))
    return tok


def train_qwen2(corpus_file, d):
    """Qwen2's tokenizer.json shape: NFC, Split + ByteLevel, <|endoftext|> and the chat tokens;
    then the same with each other Unicode normalizer (qwen2-nfd, qwen2-nfkc, qwen2-nfkd), whose
    texts with characters newer than the reference's Unicode tables are counted apart
    (stale_characters)."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train([corpus_file], byte_level_trainer(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]))
    os.makedirs(d, exist_ok=True)
    tok.save(os.path.join(d, "tokenizer.json"))
    out = {"qwen2": tok}
    for form in ("NFD", "NFKC", "NFKD"):
        j = json.loads(tok.to_str())
        j["normalizer"] = {"type": form}
        name = "qwen2-" + form.lower()
        os.makedirs(os.path.join(WORK, name), exist_ok=True)
        path = os.path.join(WORK, name, "tokenizer.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(j, f, ensure_ascii=False)
        out[name] = Tokenizer.from_file(path)
    return out


def train_sentencepiece_style(corpus_file, d_llama2, d_metaspace):
    """Llama 2 / Mistral's tokenizer.json shape: <unk> <s> </s>, the 256 <0xNN> byte tokens in
    the model's vocabulary (not added tokens), byte_fallback, fuse_unk."""
    byte_tokens = [f"<0x{i:02X}>" for i in range(256)]
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.BpeTrainer(vocab_size=8000, special_tokens=["<unk>", "<s>", "</s>"] +
                                  byte_tokens, limit_alphabet=1000, show_progress=False)
    tok.train([corpus_file], trainer)
    j = json.loads(tok.to_str())
    j["added_tokens"] = [t for t in j["added_tokens"] if t["content"] not in byte_tokens]
    j["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                   {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                 {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "<s>", "type_id": 1}},
                 {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}
    llama2 = dict(j)
    llama2["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "▁"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}
    llama2["pre_tokenizer"] = None
    llama2["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    metaspace = dict(j)
    metaspace["normalizer"] = None
    metaspace["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁",
                                  "prepend_scheme": "first", "split": True}
    metaspace["decoder"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first",
                            "split": True}
    out = []
    for d, spec in ((d_llama2, llama2), (d_metaspace, metaspace)):
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(spec, f, ensure_ascii=False)
        out.append(Tokenizer.from_file(os.path.join(d, "tokenizer.json")))
    return out


def train_sentencepiece(corpus_file, model_type, path, byte_fallback):
    spm.SentencePieceTrainer.train(
        input=corpus_file, model_prefix=path, vocab_size=6000, model_type=model_type,
        character_coverage=0.98, byte_fallback=byte_fallback, input_sentence_size=300000,
        shuffle_input_sentence=True, num_threads=os.cpu_count() or 2, minloglevel=2,
        max_sentence_length=8192)
    return spm.SentencePieceProcessor(model_file=path + ".model")

# ----------------------------------------------------------------------------------------------
# Comparing


def write_texts(path, texts):
    with open(path, "wb") as f:
        f.write(struct.pack("<I", len(texts)))
        for t in texts:
            b = t if isinstance(t, bytes) else t.encode()
            f.write(struct.pack("<I", len(b)))
            f.write(b)


def read_texts(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,), pos, out = struct.unpack_from("<I", data), 4, []
    for _ in range(n):
        (k,) = struct.unpack_from("<I", data, pos)
        out.append(data[pos + 4:pos + 4 + k])
        pos += 4 + k
    return out


def write_ids(path, seqs):
    with open(path, "wb") as f:
        f.write(struct.pack("<I", len(seqs)))
        for s in seqs:
            f.write(struct.pack(f"<I{len(s)}i", len(s), *s))


def read_ids(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,), pos, out = struct.unpack_from("<I", data), 4, []
    for _ in range(n):
        (k,) = struct.unpack_from("<I", data, pos)
        out.append(list(struct.unpack_from(f"<{k}i", data, pos + 4)))
        pos += 4 + 4 * k
    return out


def probe(*args):
    r = subprocess.run([PROBE, *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"zerod_tokenizer_probe {' '.join(args)}: exit {r.returncode}\n"
                         f"{r.stdout}{r.stderr}")
    return r.stdout, r.stderr


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def stale_characters(form):
    """The assigned characters (Python's Unicode 14 tables) that Hugging Face tokenizers'
    normalizer leaves as they are where Unicode normalizes them: its tables predate Unicode 12
    (e.g. U+32FF SQUARE ERA NAME REIWA, Unicode 12.1, under NFKC). zerod normalizes on utf8proc's
    current tables, so texts holding one may tokenize differently; they are counted apart."""
    hf = getattr(normalizers, form)()
    stale = set()
    for cp in range(0x110000):
        c = chr(cp)
        if 0xD800 <= cp < 0xE000 or unicodedata.category(c) == "Cn":
            continue
        if hf.normalize_str(c) != unicodedata.normalize(form, c):
            stale.add(c)
    return stale


def compare(name, path, docs, texts_file, ref_encode, ref_decode, ref_info, specials=False,
            ref_encode_specials=None, excused=frozenset()):
    failures = 0
    t0 = time.time()
    ref = ref_encode(docs)
    t_ref = time.time() - t0
    out = os.path.join(WORK, f"{name}.ids")
    _, err = probe("encode", path, texts_file, out)
    got = read_ids(out)
    mismatches = [i for i, (a, b) in enumerate(zip(ref, got)) if a != b]
    # Texts with characters the reference's Unicode tables predate (stale_characters).
    stale_texts = [i for i in mismatches if excused and not excused.isdisjoint(docs[i])]
    mismatches = [i for i in mismatches if i not in stale_texts]
    for i in mismatches[:3]:
        k = first_difference(ref[i], got[i])
        print(f"  {name}: text {i} differs at token {k}: reference {ref[i][max(0, k - 3):k + 5]} "
              f"zerod {got[i][max(0, k - 3):k + 5]}\n    text around: "
              f"{docs[i][:400]!r}", file=sys.stderr)
    failures += len(mismatches) + abs(len(ref) - len(got))
    tokens = sum(len(r) for r in ref)
    nbytes = sum(len(d.encode()) for d in docs)
    line = (f"{name}: {len(docs)} texts, {nbytes} bytes, {tokens} tokens: "
            f"{len(mismatches)} mismatched (reference {t_ref:.1f} s; zerod {err.strip()})")
    if excused:
        line += (f"; {len(stale_texts)} other texts differ, each holding one of the "
                 f"{len(excused)} characters whose normalization the reference's tables predate")
    # Decode of the reference ids.
    ids_file = os.path.join(WORK, f"{name}.ref_ids")
    write_ids(ids_file, ref)
    dec_out = os.path.join(WORK, f"{name}.decoded")
    probe("decode", path, ids_file, dec_out)
    got_text = read_texts(dec_out)
    ref_text = [ref_decode(r).encode() for r in ref]
    dec_bad = [i for i, (a, b) in enumerate(zip(ref_text, got_text)) if a != b]
    for i in dec_bad[:3]:
        k = first_difference(ref_text[i], got_text[i])
        print(f"  {name}: decode of text {i} differs at byte {k}: reference "
              f"{ref_text[i][max(0, k - 20):k + 20]!r} zerod {got_text[i][max(0, k - 20):k + 20]!r}",
              file=sys.stderr)
    failures += len(dec_bad)
    roundtrip = [i for i, (d, t) in enumerate(zip(docs, ref_text)) if t == d.encode()]
    line += (f"; decode: {len(dec_bad)} mismatched ({len(roundtrip)}/{len(docs)} round-trip "
             "exactly)")
    if specials:
        ref_s = ref_encode_specials(docs)
        out_s = os.path.join(WORK, f"{name}.ids_specials")
        probe("encode", path, texts_file, out_s, "--specials")
        bad_s = sum(1 for a, b in zip(ref_s, read_ids(out_s)) if a != b)
        failures += bad_s
        line += f"; with BOS/EOS: {bad_s} mismatched"
    info = json.loads(probe("info", path)[0])
    if info["vocab_size"] != ref_info["vocab_size"]:
        print(f"  {name}: vocab_size {info['vocab_size']} != reference {ref_info['vocab_size']}",
              file=sys.stderr)
        failures += 1
    print(line, flush=True)
    return failures, roundtrip


def main():
    t0 = time.time()
    parts = make_corpus()
    corpus = "".join(parts)
    corpus_file = os.path.join(WORK, "corpus.txt")
    with open(corpus_file, "w", encoding="utf-8") as f:
        f.write(corpus)
    docs = split_documents(parts)
    texts_file = os.path.join(WORK, "texts.bin")
    write_texts(texts_file, docs)
    print(f"corpus: {len(corpus.encode())} bytes, {len(docs)} texts ({time.time() - t0:.1f} s)",
          flush=True)

    t0 = time.time()
    gpt2 = train_gpt2(corpus_file, os.path.join(WORK, "gpt2"))
    llama3 = train_llama3(corpus_file, os.path.join(WORK, "llama3"))
    qwen2 = train_qwen2(corpus_file, os.path.join(WORK, "qwen2"))
    llama2, metaspace = train_sentencepiece_style(corpus_file, os.path.join(WORK, "llama2"),
                                                  os.path.join(WORK, "metaspace"))
    # sentencepiece keeps every character of its coverage in the vocabulary: trained without the
    # section of every code point.
    sp_file = os.path.join(WORK, "corpus-sp.txt")
    with open(sp_file, "w", encoding="utf-8") as f:
        f.write("".join(p for p in parts if p is not parts[-2]))
    sp_uni = train_sentencepiece(sp_file, "unigram", os.path.join(WORK, "sp-unigram"), False)
    sp_bpe = train_sentencepiece(sp_file, "bpe", os.path.join(WORK, "sp-bpe"), True)
    print(f"trained 8 tokenizers ({time.time() - t0:.1f} s)", flush=True)

    def hf(tok):
        return dict(
            ref_encode=lambda ds: [e.ids for e in tok.encode_batch(ds, add_special_tokens=False)],
            ref_encode_specials=lambda ds: [e.ids for e in tok.encode_batch(ds)],
            ref_decode=lambda ids: tok.decode(ids, skip_special_tokens=False),
            ref_info={"vocab_size": tok.get_vocab_size(with_added_tokens=True)})

    def sp(proc):
        return dict(ref_encode=lambda ds: proc.encode(ds),
                    ref_decode=lambda ids: proc.decode(ids),
                    ref_info={"vocab_size": proc.get_piece_size()})

    failures, roundtrips = 0, {}

    def check(name, *args, **kwargs):
        nonlocal failures
        f, roundtrips[name] = compare(name, *args, **kwargs)
        failures += f

    check("gpt2", os.path.join(WORK, "gpt2", "tokenizer.json"), docs, texts_file,
                        **hf(gpt2))
    check("gpt2-files", os.path.join(WORK, "gpt2-files"), docs, texts_file,
                        **hf(gpt2))
    check("llama3", os.path.join(WORK, "llama3"), docs, texts_file, specials=True,
                        **hf(llama3))
    for name, tok in qwen2.items():
        form = "NFC" if name == "qwen2" else name.split("-")[1].upper()
        stale = stale_characters(form)
        if form == "NFC" and stale:  # Qwen2's own form must match on every text
            print(f"  {name}: the reference's NFC differs from Unicode's on {len(stale)} "
                  "characters", file=sys.stderr)
            failures += 1
        check(name, os.path.join(WORK, name), docs, texts_file, excused=frozenset(stale),
              **hf(tok))
    check("llama2", os.path.join(WORK, "llama2", "tokenizer.json"), docs,
                        texts_file, specials=True, **hf(llama2))
    check("metaspace", os.path.join(WORK, "metaspace"), docs, texts_file,
                        **hf(metaspace))
    check("sp-unigram", os.path.join(WORK, "sp-unigram.model"), docs, texts_file,
                        **sp(sp_uni))
    check("sp-bpe", os.path.join(WORK, "sp-bpe.model"), docs, texts_file,
                        **sp(sp_bpe))

    # Byte-level: any bytes round-trip (C++ only; the Python libraries take str), on the texts
    # the reference round-trips (added tokens with lstrip/rstrip eat spaces).
    for name, path in (("gpt2", os.path.join(WORK, "gpt2")),
                       ("gpt2-files", os.path.join(WORK, "gpt2-files", "vocab.json")),
                       ("llama3", os.path.join(WORK, "llama3", "tokenizer.json"))):
        invalid = with_invalid_bytes([docs[i] for i in roundtrips[name] if i % 4 == 0])
        invalid_file = os.path.join(WORK, f"{name}.invalid.bin")
        write_texts(invalid_file, invalid)
        r = subprocess.run([PROBE, "roundtrip", path, invalid_file], capture_output=True,
                           text=True)
        print(f"{name}: invalid UTF-8 {r.stdout.strip()}", flush=True)
        if r.returncode != 0:
            print(r.stderr, file=sys.stderr)
            failures += 1
    if failures:
        print(f"FAILED: {failures} mismatches", file=sys.stderr)
        return 1
    print("all tokenizers match")
    return 0


if __name__ == "__main__":
    sys.exit(main())
