"""The fake Hub works with the real huggingface_hub and transformers clients, in and out of process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from urllib.error import URLError
from urllib.request import urlopen

import pytest
import torch
from fake_hub import FakeHub, hub_env
from huggingface_hub import (
    HfApi,
    create_repo,
    hf_hub_download,
    list_repo_files,
    snapshot_download,
    upload_file,
    upload_folder,
)
from huggingface_hub.errors import EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError
from transformers import AutoModel, BertConfig, BertModel

pytestmark = pytest.mark.slow  # subprocesses and long runs: left out of the fast subset

FILES = {
    "README.md": "---\nlicense: apache-2.0\n---\n# Test repo\n",
    "config.json": '{"hidden_size": 8}\n',
    "nested/deeper/data.txt": "some data\n",
}


@pytest.fixture(scope="module")
def uploaded_repo(fake_hub: FakeHub, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A repo id holding FILES, uploaded with upload_folder."""
    folder = tmp_path_factory.mktemp("upload")
    for name, text in FILES.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    repo_id = "org/uploaded"
    create_repo(repo_id)
    upload_folder(repo_id=repo_id, folder_path=folder)
    return repo_id


def test_create_repo_with_exist_ok_returns_the_same_repo(fake_hub: FakeHub) -> None:
    first = create_repo("org/twice", exist_ok=True)
    second = create_repo("org/twice", exist_ok=True)
    assert first == second == f"{fake_hub.url}/org/twice"
    assert second.repo_id == "org/twice"


def test_upload_folder_commits_every_file(uploaded_repo: str) -> None:
    assert list_repo_files(uploaded_repo) == sorted([".gitattributes", *FILES])


def test_hf_hub_download_caches_under_temp_hf_home(uploaded_repo: str) -> None:
    path = Path(hf_hub_download(uploaded_repo, "nested/deeper/data.txt"))
    assert path.read_text() == FILES["nested/deeper/data.txt"]
    assert path.is_relative_to(os.environ["HF_HOME"])


def test_snapshot_download_fetches_the_whole_repo(uploaded_repo: str) -> None:
    folder = Path(snapshot_download(uploaded_repo))
    assert {name: (folder / name).read_text() for name in FILES} == FILES


def test_missing_file_repo_and_revision_raise_hub_errors(uploaded_repo: str) -> None:
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(uploaded_repo, "missing.txt")
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("org/missing", "config.json")
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download(uploaded_repo, "config.json", revision="no-such-branch")


def test_each_commit_is_a_revision(fake_hub: FakeHub) -> None:
    api = HfApi()
    api.create_repo("org/revisions")
    first = upload_file(path_or_fileobj=b"v1", path_in_repo="a/file.txt", repo_id="org/revisions")
    second = upload_file(path_or_fileobj=b"v2", path_in_repo="a/file.txt", repo_id="org/revisions")
    assert first.oid != second.oid
    assert api.repo_info("org/revisions").sha == second.oid
    assert Path(hf_hub_download("org/revisions", "a/file.txt", revision=first.oid)).read_bytes() == b"v1"
    assert Path(hf_hub_download("org/revisions", "a/file.txt")).read_bytes() == b"v2"
    assert [entry.path for entry in api.list_repo_tree("org/revisions")] == [".gitattributes", "a"]
    api.delete_folder("a", repo_id="org/revisions")
    assert list_repo_files("org/revisions") == [".gitattributes"]


def test_transformers_push_to_hub_and_from_pretrained_round_trip(fake_hub: FakeHub) -> None:
    torch.manual_seed(0)
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    model = BertModel(config).eval()
    model.push_to_hub("org/tiny-bert")
    loaded = AutoModel.from_pretrained("org/tiny-bert").eval()
    input_ids = torch.tensor([[1, 5, 7, 2]])
    with torch.no_grad():
        expected, actual = model(input_ids).last_hidden_state, loaded(input_ids).last_hidden_state
    assert isinstance(loaded, BertModel)
    torch.testing.assert_close(actual, expected)
    assert {"README.md", "config.json", "model.safetensors"} <= set(list_repo_files("org/tiny-bert"))


DOWNLOAD_SCRIPT = (
    "from huggingface_hub import hf_hub_download; print(open(hf_hub_download('org/child', 'hi.txt')).read())"
)


def test_child_process_downloads_then_reads_cache_offline(tmp_path: Path) -> None:
    def download(env: dict[str, str]) -> str:
        args = [sys.executable, "-c", DOWNLOAD_SCRIPT]
        return subprocess.run(args, env=env, capture_output=True, text=True, check=True, timeout=60).stdout

    with FakeHub() as hub:
        hub.create_repo("model", "org/child", private=False).commit("main", {"hi.txt": b"hello"}, "add hi.txt")
        env = hub_env(hub.url, tmp_path / "hf_home")
        assert download(env) == "hello\n"
    with pytest.raises(URLError):  # the server is gone: what follows comes from the cache
        urlopen(hub.url, timeout=5)
    assert download({**env, "HF_HUB_OFFLINE": "1"}) == "hello\n"
