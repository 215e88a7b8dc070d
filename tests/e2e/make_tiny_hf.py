"""A tiny Llama in Hugging Face format (random bf16 weights, real 32k SPM tokenizer) for vLLM e2e tests.

No hub: the config is written here and the tokenizer is converted by `transformers` from a vocab-only
GGUF (llama.cpp's models/ggml-vocab-llama-spm.gguf: LLaMA's 32k SentencePiece vocabulary). The
converter adds no BOS token; this script makes the tokenizer add it (`Hello world` -> [1, 15043, 3186],
as LLaMA's own tokenizer does) and gives it a chat template. `--think` adds `<think>` and `</think>` to the
vocabulary (ids 32000 and 32001, added tokens that are not special, as DeepSeek-R1's and Qwen3's are: their
text survives detokenization), so vLLM's reasoning parsers find them; the embedding and lm_head are sized
to the vocabulary (random rows like the rest). Shape as tests/e2e/make_tiny_gguf.py:
4 layers, hidden 512, 8 query / 4 KV heads, FFN 1536: 45 M parameters, ~91 MB of safetensors. The
output is noise, but prefill and decode cost what a real model of this shape costs. Run with the vLLM
venv's python (it has torch, transformers and gguf). Usage:
    python make_tiny_hf.py --vocab ggml-vocab-llama-spm.gguf --out DIR [--think]
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

# A plain template: one line per message, a role tag, the assistant's turn opened when asked. Special
# tokens are written as text and parsed by the tokenizer, so the BOS is counted once, as vLLM counts it.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
HELLO_IDS = [1, 15043, 3186]  # "Hello world" with LLaMA's tokenizer, BOS first
THINK = ("<think>", "</think>")   # DeepSeek-R1's and Qwen3's markers; --think appends them to the 32k vocabulary


def tokenizer(vocab: Path, think: bool = False):
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as d:
        shutil.copy(vocab, Path(d) / "vocab.gguf")
        tok = AutoTokenizer.from_pretrained(d, gguf_file="vocab.gguf")
    tok.add_bos_token = True
    tok.add_eos_token = False
    if hasattr(tok, "update_post_processor"):
        tok.update_post_processor()
    tok.chat_template = CHAT_TEMPLATE
    ids = tok("Hello world")["input_ids"]
    if ids != HELLO_IDS:
        raise SystemExit(f"the converted tokenizer gives {ids} for 'Hello world', not {HELLO_IDS}")
    if think:
        from transformers import AddedToken

        base = len(tok)
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK])
        want = {t: base + i for i, t in enumerate(THINK)}
        got = {t: tok.convert_tokens_to_ids(t) for t in THINK}
        one = tok("a</think>b", add_special_tokens=False)["input_ids"]
        if got != want or one.count(want["</think>"]) != 1 or tok.decode([want["</think>"]]) != "</think>":
            raise SystemExit(f"the think tokens are not single added tokens: {got} (want {want}), "
                             f"'a</think>b' -> {one}")
    chat = tok.apply_chat_template([{"role": "user", "content": "Hello world"}], add_generation_prompt=True,
                                   tokenize=True)
    if hasattr(chat, "keys"):  # newer transformers return a BatchEncoding
        chat = chat["input_ids"]
    if chat.count(1) != 1 or chat[0] != 1:
        raise SystemExit(f"the chat template does not give exactly one leading BOS: {chat}")
    return tok


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=1536)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--think", action="store_true", help="add <think> and </think> to the vocabulary")
    a = ap.parse_args()

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = tokenizer(Path(a.vocab), a.think)
    torch.manual_seed(a.seed)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=a.hidden, intermediate_size=a.ffn,
                         num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                         max_position_embeddings=a.context, rms_norm_eps=1e-5, rope_theta=10000.0,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, tie_word_embeddings=False,
                         torch_dtype="bfloat16")
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    out = Path(a.out)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    n = sum(p.numel() for p in model.parameters())
    think = {t: tok.convert_tokens_to_ids(t) for t in THINK} if a.think else {}
    print(f"make_tiny_hf: {n / 1e6:.1f} M parameters, vocab {len(tok)}, written to {out}"
          + (f"; think tokens {think}" if think else ""))


if __name__ == "__main__":
    main()
