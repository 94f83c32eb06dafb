"""Shared fixtures: an offline fake Hugging Face Hub."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fake_hub import FakeHub, patch_hub_client


@pytest.fixture(scope="module")
def fake_hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeHub]:
    """A running :class:`FakeHub` that huggingface_hub and transformers use instead of huggingface.co.

    For the test module, HF_ENDPOINT/HF_TOKEN point at the fake Hub and HF_HOME (``os.environ["HF_HOME"]``)
    is a fresh temp dir, in this process and in child processes; everything is restored afterwards.
    """
    with FakeHub() as hub, patch_hub_client(hub.url, tmp_path_factory.mktemp("hf_home")):
        yield hub
