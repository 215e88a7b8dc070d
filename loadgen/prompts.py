"""Synthetic prompt text.

Rule (matches the built-in simulator's tokenizer, where a token is a run of non-whitespace): a prompt of
N tokens is N words joined by single spaces. Words come from a fixed vocabulary, chosen by a seeded
generator per request, so prompts are reproducible and two requests share no prefix by accident (the
first words alone make a collision improbable, 1 in 4096^4). Real tokenizers split these words
differently: against a real server the count is approximate, and each row records the server's own
count from `usage`.
"""
from __future__ import annotations

import numpy as np

_SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "sa", "te", "vo", "zu", "pe", "di", "go", "ha", "ji", "fu", "be"]
# 4096 distinct three-syllable words.
VOCAB = np.array([a + b + c for a in _SYLLABLES for b in _SYLLABLES for c in _SYLLABLES] * 1, dtype=object)
VOCAB = np.array([w + s for w in VOCAB for s in ("", "n")][:4096], dtype=object)


def synthetic_text(n_tokens: int, rng: np.random.Generator) -> str:
    return " ".join(VOCAB[rng.integers(0, len(VOCAB), n_tokens)])
