"""Exact-length synthetic prompts under several tokenizers (local ones built here, never downloaded)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.plan import prompts
from loadgen.probe import server_tokenizer
from loadgen.plan.prompts import (
    ApproximateTokenizer,
    LocalTokenizer,
    PromptMaker,
    TokenizerError,
)

SENTENCES = ["the quick brown fox jumps over the lazy dog", "kalo mine rusa tevo zupe digo haji fube",
             "a prompt of exactly n tokens, checked by a round trip.", "1 2 3 x y z I a"] * 20


@pytest.fixture(scope="module")
def bpe_json(tmp_path_factory):
    # A tiny byte-level BPE trained on a few sentences: syllable words split into several tokens each.
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(SENTENCES, trainer)
    p = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(p))
    return p


@pytest.fixture(scope="module")
def wordlevel_json(tmp_path_factory):
    # Whitespace word-level with [UNK]: every word is one token, like the simulator.
    from tokenizers import Tokenizer, models, pre_tokenizers
    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "the": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    p = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(p))
    return p


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 200, 513])
def test_exact_lengths_under_a_bpe_tokenizer(bpe_json, n):
    tok = LocalTokenizer(bpe_json)
    assert not tok.whitespace_exact()  # the search path, not the one-word-one-token shortcut
    maker = PromptMaker(tok)
    text = maker.text(n, np.random.default_rng(n))
    assert tok.count(text) == n and maker.summary() == {"prompts": 1, "checked": 1, "exact": 1, "max_abs_error": 0}


@pytest.mark.parametrize("n", [1, 100, 4096])
def test_exact_lengths_under_a_word_level_tokenizer(wordlevel_json, n):
    tok = LocalTokenizer(wordlevel_json)
    assert tok.whitespace_exact()
    text = PromptMaker(tok).text(n, np.random.default_rng(0))
    assert tok.count(text) == n


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 3000), seed=st.integers(0, 2**32))
def test_same_seed_same_text_and_no_repeated_word(n, seed):
    maker = PromptMaker(ApproximateTokenizer())
    a = maker.text(n, np.random.default_rng(seed))
    assert a == maker.text(n, np.random.default_rng(seed))
    words = a.split(" ")
    assert len(words) == n and len(set(words)) == n


def test_different_requests_do_not_share_a_first_word():
    rng = np.random.default_rng(9)
    firsts = [PromptMaker(ApproximateTokenizer()).text(4, rng).split()[0] for _ in range(2000)]
    assert len(set(firsts)) > 1990  # 2000 draws from ~1M words: collisions are rare, not systematic


def test_missing_tokenizer_file_says_how_to_fix(tmp_path):
    with pytest.raises(TokenizerError, match="never downloads tokenizers.*tokenizer_file.*server"):
        LocalTokenizer(tmp_path / "tokenizer.json")


def test_auto_falls_back_to_approximate_with_a_warning():
    tok, warning = server_tokenizer.resolve("auto", "http://127.0.0.1:9", None)  # nothing listens on port 9
    assert tok.mode == "approximate" and "APPROXIMATE" in warning
    with pytest.raises(TokenizerError):
        server_tokenizer.resolve("server", "http://127.0.0.1:9", None)
    tok, warning = server_tokenizer.resolve("approximate", "http://127.0.0.1:9", None)
    assert tok.mode == "approximate" and warning is None  # asked for: no warning


def test_whitespace_exact_tokenizers_check_the_first_prompts_then_a_sample(wordlevel_json):
    maker = PromptMaker(LocalTokenizer(wordlevel_json))
    rng = np.random.default_rng(0)
    for _ in range(prompts.FULL_CHECKS + 3 * prompts.CHECK_EVERY):
        maker.text(3, rng)
    s = maker.summary()
    assert s["prompts"] == prompts.FULL_CHECKS + 3 * prompts.CHECK_EVERY
    assert s["checked"] == s["exact"] == prompts.FULL_CHECKS + 3 and s["max_abs_error"] == 0
