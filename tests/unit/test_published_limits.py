"""probe/discover.published_limits: every limit a server publishes, from its /v1/models and /props answers."""
from loadgen.probe.discover import published_limits


def test_vllm_publishes_max_model_len_and_no_slots():
    models = {"object": "list", "data": [{"id": "m", "owned_by": "vllm", "max_model_len": 32768}]}
    assert published_limits(models, None) == {"max_model_len": 32768, "slots": None, "ctx_per_slot": None}


def test_llamacpp_publishes_slots_and_tokens_per_slot():
    models = {"data": [{"id": "m", "owned_by": "llamacpp", "meta": {"n_ctx_train": 131072}}]}
    props = {"total_slots": 2, "default_generation_settings": {"n_ctx": 4096}}
    assert published_limits(models, props) == {"max_model_len": 4096, "slots": 2, "ctx_per_slot": 4096}


def test_nonsense_is_no_limit():
    for models, props in [(None, None), ({"data": "x"}, []), ({"data": [{"max_model_len": True}]},
                                                            {"total_slots": -1, "default_generation_settings": 5}),
                          ({"data": [{"max_model_len": "8192"}]}, {"total_slots": 0})]:
        assert published_limits(models, props) == {"max_model_len": None, "slots": None, "ctx_per_slot": None}
