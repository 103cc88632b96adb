"""A job's tokenizer from text to export: a byte-level BPE tokenizer.json trained here with
Hugging Face tokenizers, `zerod-shards --tokenizer` on JSONL, `zerod train` with data.tokenizer
(the tokenizer goes into every checkpoint), `zerod eval`'s sample decoded with it, `zerod
generate --prompt` from the checkpoint with no --tokenizer, and `zeroctl export`, whose
directory AutoTokenizer.from_pretrained loads with the same ids as the original.

  python tokenizer_roundtrip.py ZEROD ZEROCTL ZEROD_SHARDS WORKDIR
"""
import json
import os
import subprocess
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, AutoTokenizer


def run(*cmd, cwd):
    r = subprocess.run(list(cmd), capture_output=True, text=True, cwd=cwd)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    return r


def main():
    zerod, zeroctl, shards, work = sys.argv[1:5]
    os.makedirs(os.path.join(work, "tok"), exist_ok=True)
    words = ["hello", "world", "token", "zerod", "shard", "model", "Ünïcödé", "数据", "🙂", "x=1;"]
    texts = [" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(5 + i % 9))
             for i in range(600)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok_path = os.path.join(work, "tok", "tokenizer.json")
    tok.save(tok_path)
    vocab = tok.get_vocab_size()
    with open(os.path.join(work, "corpus.jsonl"), "w") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
    run(shards, "--tokenizer", "tok/tokenizer.json", "--jsonl", "--append-eos", "--prefix", "c",
        "--val-fraction", "0.1", "--out-dir", "data", "corpus.jsonl", cwd=work)
    job = {"train_micro_batch_size_per_gpu": 4, "steps_per_print": 10,
           "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
           "model": {"n_layer": 1, "n_head": 2, "n_embd": 32, "vocab_size": vocab, "seq_len": 32},
           "data": {"train": "data/c_train_*.bin", "val": "data/c_val_*.bin",
                    "tokenizer": "tok/tokenizer.json"},
           "train": {"steps": 30, "checkpoint_dir": "ckpt", "save_interval": 30}}
    with open(os.path.join(work, "job.json"), "w") as f:
        json.dump(job, f)
    run(zerod, "--log-level", "warn", "train", "job.json", cwd=work)
    ok = True

    manifest = json.load(open(os.path.join(work, "ckpt", "global_step30", "manifest.json")))
    names = sorted(f["name"] for f in manifest["tokenizer"]["files"])
    good = names == ["tokenizer/tokenizer.json", "tokenizer/tokenizer_config.json"]
    print(f"checkpoint carries the tokenizer: {'ok' if good else 'FAIL'} {names}")
    ok &= good

    # eval: the sample line decodes the first validation sample's start with the tokenizer.
    r = run(zerod, "--log-level", "warn", "eval", "job.json", "--sample-tokens", "8", cwd=work)
    sample = [l for l in r.stdout.splitlines() if l.startswith("sample (")]
    val = open(os.path.join(work, "data", "c_val_000000.bin"), "rb").read()[1024:]
    first = [int.from_bytes(val[i:i + 2], "little") for i in range(0, 2 * 16, 2)]
    good = len(sample) == 1 and (": " + tok.decode(first, skip_special_tokens=False) + "[[") in sample[0]
    print(f"zerod eval sample decoded with data.tokenizer: {'ok' if good else 'FAIL'} {sample}")
    ok &= good

    # generate --prompt from the checkpoint, no --tokenizer: the text is the tokenizer's decode
    # of the ids it reports.
    r = run(zerod, "--log-level", "warn", "generate", "--from", "ckpt", "--prompt", "hello world",
            "--max-new-tokens", "6", cwd=work)
    ids = [int(x) for x in r.stderr.split("new ids: ")[1].split("\n")[0].split()]
    good = r.stdout.rstrip("\n") == tok.decode(ids, skip_special_tokens=False) and len(ids) >= 1
    print(f"zerod generate --prompt with the checkpoint's tokenizer: {'ok' if good else 'FAIL'}")
    ok &= good

    # export: AutoTokenizer.from_pretrained(DIR) gives the original tokenizer's ids.
    run(zeroctl, "export", "ckpt", "--out", "hf", cwd=work)
    out = os.path.join(work, "hf")
    auto = AutoTokenizer.from_pretrained(out)
    probe = texts[:50] + ["hello <|endoftext|> world", "Ünïcödé 🙂 数据 unseen words"]
    good = all(auto.encode(t) == tok.encode(t).ids for t in probe)
    good &= auto.eos_token == "<|endoftext|>" and auto.model_max_length == 32
    AutoModelForCausalLM.from_pretrained(out)
    print(f"zeroctl export -> AutoTokenizer.from_pretrained: {'ok' if good else 'FAIL'} "
          f"({type(auto).__name__}, eos {auto.eos_token!r})")
    ok &= good
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
