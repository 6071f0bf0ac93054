#!/usr/bin/env python3
"""Writes the SentencePiece-style Hugging Face tokenizer folders of engine/tests/text/hf_tokenizer.rs
and what transformers makes of a set of hostile-ish texts, so the test needs no Python.

Three tiny tokenizers, trained here with sentencepiece on assets/perplexity's chapter (the Hub
is not reachable, so no real model's tokenizer is copied):
- llama2/: a byte-fallback BPE converted by transformers' LlamaTokenizer (legacy), then laid out
  as Llama 2's tokenizer.json on the Hub is (normalizer Prepend("▁") + Replace(" ", "▁"), no
  pre-tokenizer), since transformers 5 writes the legacy form as a Metaspace pre-tokenizer;
- mistral/: the same model converted with legacy=False (Metaspace, prepend_scheme "first", no
  prefix after a special token), with Mistral's [INST] [/INST] control tokens and a plain
  (non-special) added token;
- t5/: a Unigram model converted by T5Tokenizer (WhitespaceSplit + Metaspace, <unk> for what
  the pieces cannot spell: T5 has no byte fallback).

For each folder, cases.json holds every text with the ids transformers gives (special tokens
typed in the text parsed, as `encode` does by default), with BOS/EOS as the tokenizer adds
them, with special tokens split as text (`split_special_tokens`), and the text transformers
decodes from the first ids with skip_special_tokens. What is recorded is transformers running
the folder's tokenizer.json (PreTrainedTokenizerFast), and the script fails where another
reading disagrees: for mistral/ and t5/ the class AutoTokenizer picks; for llama2/ the
sentencepiece model itself on every text without a special token's spelling (transformers 5's
LlamaTokenizer rebuilds its pipeline from its own code, Metaspace "always", instead of the
file's normalizer, and so splits a leading space unlike sentencepiece and the file).

Usage: python3 -m venv v && v/bin/pip install transformers tokenizers sentencepiece protobuf
       v/bin/python engine/tests/data/hf_tokenizer/make_fixtures.py
"""
import json, os, shutil, sys, tempfile

import sentencepiece as spm
from transformers import AutoTokenizer, LlamaTokenizer, PreTrainedTokenizerFast, T5Tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(HERE))))
CORPUS = os.path.join(ROOT, "assets", "perplexity", "pride-and-prejudice-ch1.txt")

CASES = [
    "", " ", "  ", "\n", "Hello world", " leading space", "trailing space ",
    "multiple   spaces  here", "line one\nline two\n\n\tindented", "\r\nwindows\r\n",
    "It's a truth universally acknowledged, isn't it? Yes!", "numbers 12345 and 3.14",
    "café naïve façade", "日本語のテキスト", "emoji 🦀🎉 and ZWJ 👩‍💻", "\u00a0non-breaking",
    "rare \U0010fffd plane 16", "Mr. Bennet said:\n\"My dear\"", "▁ a literal metaspace",
    "<0x41> spelled as a byte token", "</s> typed", "<s>Hello</s>", "a<s>b</s>c", "<unk> here",
    "[INST] Who are you? [/INST] I am", "[INST]no spaces[/INST]", "with <tool> inside",
    "  <s>  spaced  </s>  ",
]


def train(workdir, kind, vocab, **ids):
    prefix = os.path.join(workdir, kind)
    spm.SentencePieceTrainer.train(
        input=CORPUS, model_prefix=prefix, vocab_size=vocab, model_type=kind,
        byte_fallback=True, split_digits=True, allow_whitespace_only_pieces=True,
        remove_extra_whitespaces=False, normalization_rule_name="identity",
        character_coverage=0.9995, hard_vocab_limit=False, minloglevel=2, **ids)
    return prefix + ".model"


def record(folder, sp_model=None):
    plain = PreTrainedTokenizerFast.from_pretrained(folder)
    auto = None if sp_model else AutoTokenizer.from_pretrained(folder)
    sp = spm.SentencePieceProcessor(model_file=sp_model) if sp_model else None
    cases = []
    for text in CASES:
        row = {"text": text}
        for name, tok in (("plain", plain), ("auto", auto)):
            ids = tok.encode(text, add_special_tokens=False)
            got = {
                "ids": ids,
                "ids_with_special": tok.encode(text, add_special_tokens=True),
                "decoded": tok.decode(ids, skip_special_tokens=True),
            }
            got["ids_split_special"] = tok.encode(text, add_special_tokens=False,
                                                  split_special_tokens=True)
            if name == "plain":
                row.update(got)
                if sp and not any(t in text for t in ("<s>", "</s>", "<unk>")) \
                        and sp.encode(text) != ids:
                    sys.exit(f"{folder}: sentencepiece gives {sp.encode(text)} for {text!r}, "
                             f"the tokenizer.json {ids}")
                if sp:
                    break
            elif got != {k: row[k] for k in got}:
                sys.exit(f"{folder}: {type(auto).__name__} and tokenizer.json disagree on {text!r}:"
                         f" {got} vs {row}")
        cases.append(row)
    with open(os.path.join(folder, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False, indent=0)
        f.write("\n")


def save(tok, name):
    out = os.path.join(HERE, name)
    shutil.rmtree(out, ignore_errors=True)
    tok.save_pretrained(out)
    for extra in ("special_tokens_map.json", "tokenizer.model", "spiece.model",
                  "chat_template.jinja"):
        if os.path.exists(os.path.join(out, extra)):
            os.remove(os.path.join(out, extra))
    edit_json(out, lambda j: None)  # compact
    return out


def edit_json(folder, change):
    path = os.path.join(folder, "tokenizer.json")
    with open(path, encoding="utf-8") as f:
        j = json.load(f)
    change(j)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False, separators=(",", ":"))


def llama2_layout(j):
    j["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "▁"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}
    j["pre_tokenizer"] = None


def main():
    with tempfile.TemporaryDirectory() as work:
        bpe = train(work, "bpe", 700, unk_id=0, bos_id=1, eos_id=2)
        src = os.path.join(work, "llama")
        os.makedirs(src)
        shutil.copy(bpe, os.path.join(src, "tokenizer.model"))
        llama2 = save(LlamaTokenizer.from_pretrained(src, legacy=True, add_bos_token=True), "llama2")
        edit_json(llama2, llama2_layout)
        mistral_tok = LlamaTokenizer.from_pretrained(src, legacy=False, add_bos_token=True)
        mistral_tok.add_special_tokens({"additional_special_tokens": ["[INST]", "[/INST]"]})
        mistral_tok.add_tokens(["<tool>"])
        save(mistral_tok, "mistral")

        uni = train(work, "unigram", 600, pad_id=0, eos_id=1, unk_id=2, bos_id=-1)
        src = os.path.join(work, "t5")
        os.makedirs(src)
        shutil.copy(uni, os.path.join(src, "spiece.model"))
        save(T5Tokenizer.from_pretrained(src, extra_ids=0), "t5")
        record(llama2, bpe)
        for name in ("mistral", "t5"):
            record(os.path.join(HERE, name))


if __name__ == "__main__":
    main()
