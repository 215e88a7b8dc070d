"""api = "embeddings" | "rerank" in a workload: what it takes ([rerank]), what it refuses up front (each problem
named by its key or flag, all at once), and the plan it makes (no max_tokens; rerank's documents drawn from
the seed, its planned prompt = documents x query + the documents' tokens)."""
import textwrap

import numpy as np
import pytest

from loadgen.config import workload as config
from loadgen.config.workload import ConfigError
from loadgen.plan.schedule import build, plan_records

BASE = """
model = "m"
api = "{api}"
seed = 4
[arrivals]
process = "poisson"
rate = "8/s"
[run]
requests = 40
[prompt]
tokens = {{ dist = "uniform", min = 4, max = 12 }}
"""
RERANK = """
[rerank]
documents = { dist = "uniform", min = 2, max = 6 }
document_tokens = { dist = "uniform", min = 10, max = 30 }
"""


def load(tmp_path, text: str, overrides=None):
    p = tmp_path / "w.toml"
    p.write_text(textwrap.dedent(text))
    return config.load(str(p), overrides)


def problems(tmp_path, text: str, overrides=None) -> list[str]:
    with pytest.raises(ConfigError) as e:
        load(tmp_path, text, overrides)
    return e.value.problems


def test_embeddings_needs_no_output_and_is_never_calibrated(tmp_path):
    c = load(tmp_path, BASE.format(api="embeddings"))
    assert c.api == "embeddings" and c.rerank is None and c.calibrate is False
    assert c.output_tokens == config.Lengths(value=0)   # what the manifest's config says: nothing asked
    s = build(c)
    assert (s.max_tokens == 0).all() and s.document_tokens is None
    assert ((s.prompt_tokens >= 4) & (s.prompt_tokens <= 12)).all()


def test_rerank_documents_are_drawn_from_the_seed(tmp_path):
    c = load(tmp_path, BASE.format(api="rerank") + RERANK)
    assert c.rerank is not None and c.rerank.documents == config.Lengths("uniform", min=2, max=6)
    s, again = build(c), build(c)
    docs = s.document_tokens
    assert docs is not None and len(docs) == len(s) == 40
    assert all(2 <= len(d) <= 6 and ((d >= 10) & (d <= 30)).all() for d in docs)
    assert len({len(d) for d in docs}) > 1                      # the count is drawn per request
    # the planned prompt: every (query, document) pair the server scores
    want = np.array([len(d) * q + int(d.sum()) for d, q in zip(docs, s.new_tokens)])
    assert (s.prompt_tokens == want).all() and (s.max_tokens == 0).all()
    assert all((a == b).all() for a, b in zip(docs, again.document_tokens))   # the same plan every time
    rec = plan_records(s)[0]
    assert rec["query_tokens"] == int(s.new_tokens[0]) and rec["document_tokens"] == docs[0].tolist()


def test_rerank_documents_default_to_eight(tmp_path):
    c = load(tmp_path, BASE.format(api="rerank") + "[rerank]\ndocument_tokens = 16\n")
    assert all(len(d) == 8 and (d == 16).all() for d in build(c).document_tokens)


def test_rerank_without_document_lengths_is_refused(tmp_path):
    found = problems(tmp_path, BASE.format(api="rerank"))
    assert any("rerank.document_tokens: missing" in p for p in found), found
    found = problems(tmp_path, BASE.format(api="rerank") + "[rerank]\ndocuments = 3\n")
    assert any("rerank.document_tokens: missing" in p for p in found), found


def test_a_rerank_table_with_another_api_is_refused(tmp_path):
    found = problems(tmp_path, BASE.format(api="embeddings") + RERANK)
    assert any("w.toml: rerank: the [rerank] table is for api = \"rerank\" only" in p for p in found), found


@pytest.mark.parametrize("api", ["embeddings", "rerank"])
def test_what_makes_no_sense_is_refused_each_named(tmp_path, api):
    text = BASE.format(api=api) + (RERANK if api == "rerank" else "") + textwrap.dedent("""
        [output]
        tokens = 16
        [request]
        response_format = { properties = 3 }
        [session]
        turns = 3
        think_ms = 100
        [abandon]
        share = 0.5
        after_tokens = 4
        [image]
        width = 64
        height = 64
        """)
    found = problems(tmp_path, text)
    for key in ("output.tokens", "request.response_format", "session", "abandon.after_tokens", "image"):
        assert any(f"w.toml: {key}:" in p for p in found), (key, found)
    assert any("generates no token" in p for p in found)


def test_flags_are_named_by_their_flag(tmp_path):
    found = problems(tmp_path, BASE.format(api="embeddings"), {"--max-tokens": "16", "--slo": "ttft=200ms,e2e=1s"})
    assert any(p.startswith("--max-tokens:") and "no output length" in p for p in found), found
    assert any(p.startswith("--slo: ttft:") and "only e2e" in p for p in found), found
    assert not any("e2e:" in p for p in found), found
    c = load(tmp_path, BASE.format(api="embeddings"), {"--slo": "e2e=1s"})
    assert c.slo == (("e2e", 1000.0),)


def test_tools_mix_output_priority_and_prefix_are_refused(tmp_path):
    text = BASE.format(api="rerank") + RERANK + textwrap.dedent("""
        [prefix]
        tokens = 2
        [request]
        tools = { generate = 2, parameters = 2 }
        tool_choice = "auto"
        [[mix]]
        weight = 1
        prompt = 8
        output = 4
        priority = 1
        """)
    found = problems(tmp_path, text)
    for key in ("prefix", "request.tools", "request.tool_choice", "mix[0].output", "mix[0].priority"):
        assert any(f"w.toml: {key}:" in p for p in found), (key, found)


def test_a_mix_without_output_lengths_plans(tmp_path):
    text = BASE.format(api="embeddings") + textwrap.dedent("""
        [[mix]]
        name = "short"
        weight = 1
        prompt = 8
        [[mix]]
        name = "long"
        weight = 1
        prompt = 64
        """)
    s = build(load(tmp_path, text))
    assert set(s.prompt_tokens.tolist()) == {8, 64} and (s.max_tokens == 0).all()


@pytest.mark.parametrize("api", ["embeddings", "rerank"])
def test_only_the_openai_backend_speaks_them(tmp_path, api):
    found = problems(tmp_path, BASE.format(api=api) + (RERANK if api == "rerank" else ""), {"--backend": "ollama"})
    assert any("it needs backend = \"openai\"" in p for p in found), found
