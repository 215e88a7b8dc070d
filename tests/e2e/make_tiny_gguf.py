"""A tiny llama-architecture GGUF with seeded random weights and a real tokenizer, for e2e tests.

No download: the tokenizer (vocabulary, scores, token types, BOS/EOS ids) is copied from a vocab-only
GGUF (llama.cpp ships models/ggml-vocab-llama-spm.gguf: LLaMA's 32k SentencePiece vocabulary). Shape
(defaults): 4 layers, hidden 512, 8 query / 4 KV heads (head dim 64), FFN 1536, F16 matrices and F32
norms: 45 M parameters, ~88 MB. The output is noise, but prefill and decode cost what a real model of
this shape costs, which is what a load generator measures. Usage:
    python make_tiny_gguf.py --vocab ggml-vocab-llama-spm.gguf --out tiny.gguf
"""
from __future__ import annotations

import argparse

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter, LlamaFileType


def copy_tokenizer(reader: GGUFReader, writer: GGUFWriter) -> int:
    vocab = 0
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == GGUFValueType.ARRAY else None
        value = field.contents()
        if name == "tokenizer.ggml.tokens":
            vocab = len(value)
        writer.add_key_value(name, value, vtype, sub_type=sub)
    if not vocab:
        raise SystemExit("the vocab file has no tokenizer.ggml.tokens")
    return vocab


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=1536)
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    head_dim = a.hidden // a.heads
    rng = np.random.default_rng(a.seed)

    w = GGUFWriter(a.out, "llama")
    w.add_name("loadgen-tiny-llama")
    w.add_context_length(a.context)
    w.add_embedding_length(a.hidden)
    w.add_block_count(a.layers)
    w.add_feed_forward_length(a.ffn)
    w.add_head_count(a.heads)
    w.add_head_count_kv(a.kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(LlamaFileType.MOSTLY_F16)
    vocab = copy_tokenizer(GGUFReader(a.vocab), w)
    w.add_vocab_size(vocab)

    def mat(rows: int, cols: int) -> np.ndarray:  # numpy (rows, cols) = GGUF ne (cols, rows): out x in
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)

    def norm() -> np.ndarray:
        return np.ones(a.hidden, dtype=np.float32)

    kv = a.kv_heads * head_dim
    w.add_tensor("token_embd.weight", mat(vocab, a.hidden))
    for i in range(a.layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", norm())
        w.add_tensor(p + "attn_q.weight", mat(a.hidden, a.hidden))
        w.add_tensor(p + "attn_k.weight", mat(kv, a.hidden))
        w.add_tensor(p + "attn_v.weight", mat(kv, a.hidden))
        w.add_tensor(p + "attn_output.weight", mat(a.hidden, a.hidden))
        w.add_tensor(p + "ffn_norm.weight", norm())
        w.add_tensor(p + "ffn_gate.weight", mat(a.ffn, a.hidden))
        w.add_tensor(p + "ffn_up.weight", mat(a.ffn, a.hidden))
        w.add_tensor(p + "ffn_down.weight", mat(a.hidden, a.ffn))
    w.add_tensor("output_norm.weight", norm())
    w.add_tensor("output.weight", mat(vocab, a.hidden))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
