"""probe/discover.py's model check on a model list already read (no network)."""
import pytest

from loadgen.config.workload import ConfigError
from loadgen.probe.discover import Served, check_model

OLLAMA = Served("http://h:11434/api/tags", ("llama3:latest", "qwen2:7b"),
                {"llama3:latest": {"name": "llama3:latest"}, "qwen2:7b": {"name": "qwen2:7b"}})


def test_an_ollama_name_without_a_tag_means_latest():
    assert check_model("llama3", OLLAMA, "ollama") is None
    assert check_model("qwen2:7b", OLLAMA, "ollama") is None
    with pytest.raises(ConfigError, match="'qwen2' is not served .* lists llama3:latest, qwen2:7b"):
        check_model("qwen2", OLLAMA, "ollama")


def test_servers_that_answer_under_any_name_are_not_checked_and_an_unanswered_list_warns():
    assert check_model("anything", OLLAMA, "llamacpp") is None
    one = Served("http://h/v1/models", ("base",), {})
    assert check_model("anything", one, "loadgen-sim") is None
    # the simulator serving adapters (--lora-modules) lists them beside its model and answers under those only
    with_adapters = Served("http://h/v1/models", ("base", "lora-a"),
                           {"base": {"id": "base"}, "lora-a": {"id": "lora-a", "parent": "base"}})
    assert check_model("lora-a", with_adapters, "loadgen-sim") is None
    with pytest.raises(ConfigError, match=r"mix\[1\].model: 'lora-b' is not served by the target: "
                                          r"http://h/v1/models lists base, lora-a; name one of them"):
        check_model("lora-b", with_adapters, "loadgen-sim", key="mix[1].model")
    unanswered = Served("http://h/v1/models", (), {}, "http://h/v1/models: HTTP 401")
    assert "could not check that the target serves model 'm': http://h/v1/models: HTTP 401" in \
        check_model("m", unanswered, "vllm")
