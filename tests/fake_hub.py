"""An in-memory fake of the Hugging Face Hub HTTP API, for offline upload/download tests.

The server is stdlib only. It implements what huggingface_hub 2.4 and transformers 5.23 need to create repos,
commit small files, list and download them (section 3 of the shared notes hf-integration.md):

    POST      /api/repos/create                     409 with "url" when the repo exists
    POST      /api/validate-yaml                    called for every README.md in a commit
    GET       /api/{type}s/{org}/{name}[/revision/{rev}]
    GET       /api/{type}s/{org}/{name}/tree/{rev}[/{folder}][?recursive=true]
    POST      /api/{type}s/{org}/{name}/preupload/{rev}    answers "regular" for every file
    POST      /api/{type}s/{org}/{name}/commit/{branch}    NDJSON: header, file, deletedFile, deletedFolder
    GET|HEAD  /[datasets/|spaces/]{org}/{name}/resolve/{rev}/{path}

Files are never LFS or Xet. Repo ids must be namespaced ("org/name"). Every commit gets a new sha, and a
revision is a branch name or a full commit sha. Errors carry the Hub's X-Error-Code (RepoNotFound,
RevisionNotFound, EntryNotFound), which huggingface_hub turns into its typed errors.

Child processes reach the server through ``HF_ENDPOINT`` (see :func:`hub_env`). The current process needs
:func:`patch_hub_client`, because huggingface_hub and transformers read the environment at import time.
Run ``python tests/fake_hub.py`` to get a server for manual checks.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

FAKE_TOKEN = "hf_fake_token"
REPO_TYPES = {"models": "model", "datasets": "dataset", "spaces": "space"}
Files = dict[str, bytes]
Response = tuple[bytes, dict[str, str]]


def blob_oid(data: bytes) -> str:
    """Git blob id: the Hub's ETag and tree ``oid`` of a regular (non-LFS) file."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class HubError(Exception):
    """An error answered like the Hub does: status, ``X-Error-Code``, JSON body."""

    status: int
    code: str
    message: str
    body: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)

    def response(self) -> Response:
        """JSON body ``{"error": message, **body}`` and the error headers."""
        body, headers = _json({"error": self.message, **self.body})
        headers |= {"X-Error-Code": self.code, "X-Error-Message": self.message}
        return body, headers | self.headers


@dataclass
class Repo:
    """One repository: commits (sha -> files) and branches (name -> sha)."""

    repo_id: str
    url: str
    private: bool
    commits: dict[str, Files] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)

    def files(self, revision: str) -> tuple[str, Files]:
        """Commit sha and files at a branch or commit sha."""
        sha = revision if revision in self.commits else self.branches.get(revision)
        if sha is None:
            raise HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        return sha, self.commits[sha]

    def commit(self, branch: str, files: Files, message: str) -> str:
        """Store `files` as a new commit on `branch`; its sha hashes parent and content."""
        listing = sorted((path, blob_oid(data)) for path, data in files.items())
        parent = self.branches.get(branch)
        sha = hashlib.sha1(json.dumps([parent, message, listing]).encode()).hexdigest()
        self.commits[sha] = files
        self.branches[branch] = sha
        return sha


def tree_listing(files: Files, folder: str, recursive: bool) -> list[dict]:
    """Entries of `/api/{type}s/{repo}/tree/{rev}/{folder}`: files and directories."""
    prefix = f"{folder}/" if folder else ""
    entries: dict[str, dict] = {}
    for path, data in sorted(files.items()):
        if not path.startswith(prefix):
            continue
        parts = path[len(prefix) :].split("/")
        for depth in range(1, len(parts) if recursive else min(len(parts), 2)):  # folders on the way
            sub = prefix + "/".join(parts[:depth])
            oid = hashlib.sha1(sub.encode()).hexdigest()
            entries[sub] = {"type": "directory", "path": sub, "oid": oid}
        if recursive or len(parts) == 1:
            entries[path] = {"type": "file", "path": path, "size": len(data), "oid": blob_oid(data)}
    if folder and not entries:
        raise HubError(404, "EntryNotFound", f"{folder} does not exist")
    return list(entries.values())


class FakeHub(ThreadingHTTPServer):
    """A Hub-compatible server on 127.0.0.1 (free port), served from a daemon thread.

    Use it as a context manager, or call :meth:`start` and :meth:`stop`.
    """

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self.repos: dict[tuple[str, str], Repo] = {}  # key: (repo type, repo id)
        self.lock = threading.Lock()
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    def start(self) -> FakeHub:
        """Start serving in the background."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket: later connections are refused."""
        self.shutdown()
        self.server_close()
        self._thread.join()

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def create_repo(self, repo_type: str, repo_id: str, private: bool) -> Repo:
        """A new repo whose "main" holds a .gitattributes, as on the Hub."""
        if (repo_type, repo_id) in self.repos:  # create_repo(exist_ok=True) reads "url"
            url = self.repos[repo_type, repo_id].url
            raise HubError(409, "Conflict", "You already created this repo", {"url": url})
        prefix = "" if repo_type == "model" else f"{repo_type}s/"
        repo = Repo(repo_id, f"{self.url}/{prefix}{repo_id}", private)
        gitattributes = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
        repo.commit("main", {".gitattributes": gitattributes}, "initial commit")
        self.repos[repo_type, repo_id] = repo
        return repo

    def get_repo(self, repo_type: str, repo_id: str) -> Repo:
        """The repo, or a ``RepoNotFound`` error."""
        if (repo_type, repo_id) not in self.repos:
            raise HubError(404, "RepoNotFound", f"Repository {repo_id} not found")
        return self.repos[repo_type, repo_id]


class _Handler(BaseHTTPRequestHandler):
    """Routes the Hub endpoints; answers JSON, or file bytes for ``/resolve/``."""

    server: FakeHub

    def log_message(self, format: str, *args: object) -> None:
        """Keep test output quiet."""

    def _handle(self) -> None:
        url = urlsplit(self.path)
        parts = [unquote(part) for part in url.path.strip("/").split("/")]
        try:
            with self.server.lock:
                status, (body, headers) = 200, self._route(parts, parse_qs(url.query))
        except HubError as err:
            status, (body, headers) = err.status, err.response()
        self.send_response(status)
        for name, value in {**headers, "Content-Length": str(len(body))}.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_HEAD = do_POST = _handle

    def _route(self, parts: list[str], query: dict[str, list[str]]) -> Response:
        get_repo = self.server.get_repo
        match [self.command, *parts]:
            case ["POST", "api", "repos", "create"]:
                body = self._read_json()
                if not body.get("organization"):
                    raise HubError(400, "BadRequest", "Use a namespaced id: 'org/name'")
                repo_id = f"{body['organization']}/{body['name']}"
                private = body.get("visibility") == "private"
                repo = self.server.create_repo(body.get("type", "model"), repo_id, private)
                return _json({"url": repo.url})
            case ["POST", "api", "validate-yaml"]:
                return _json({"errors": [], "warnings": []})
            case [_, "api", kind, owner, name, *rest] if kind in REPO_TYPES:
                repo = get_repo(REPO_TYPES[kind], f"{owner}/{name}")
                return _json(self._repo_api(repo, rest, query))
            case ["GET" | "HEAD", "datasets" | "spaces" as kind, owner, name, *rest]:
                return self._resolve(get_repo(REPO_TYPES[kind], f"{owner}/{name}"), rest)
            case ["GET" | "HEAD", owner, name, *rest] if owner != "api":
                return self._resolve(get_repo("model", f"{owner}/{name}"), rest)
        raise HubError(404, "NotFound", f"No route for {self.command} {self.path}")

    def _repo_api(self, repo: Repo, rest: list[str], query: dict[str, list[str]]) -> object:
        match [self.command, *rest]:
            case ["GET"]:
                return _repo_info(repo, "main")
            case ["GET", "revision", revision]:
                return _repo_info(repo, revision)
            case ["GET", "tree", revision, *folder]:
                recursive = query.get("recursive", [""])[0].lower() in ("1", "true")
                _, files = repo.files(revision)
                return tree_listing(files, "/".join(folder), recursive)
            case ["POST", "preupload", _]:  # "regular": contents come in the commit
                paths = [file["path"] for file in self._read_json()["files"]]
                mode = {"uploadMode": "regular", "shouldIgnore": False}
                return {"files": [{"path": path, **mode} for path in paths]}
            case ["POST", "commit", branch]:
                return self._commit(repo, branch)
        raise HubError(404, "NotFound", f"No route for {self.command} {self.path}")

    def _commit(self, repo: Repo, branch: str) -> dict[str, str]:
        """Apply an NDJSON commit: one ``{"key": ..., "value": ...}`` per line."""
        if branch not in repo.branches:
            raise HubError(404, "RevisionNotFound", f"Invalid rev id: {branch}")
        files, message = dict(repo.files(branch)[1]), ""
        for line in self._read_body().splitlines():
            item = json.loads(line)
            key, value = item["key"], item["value"]
            if key == "header":
                message = value["summary"]
            elif key == "file":
                files[value["path"]] = base64.b64decode(value["content"])
            elif key == "deletedFile":
                files.pop(value["path"], None)
            elif key == "deletedFolder":
                folder = value["path"].rstrip("/") + "/"
                files = {p: d for p, d in files.items() if not p.startswith(folder)}
            else:  # "lfsFile": preupload never asks for LFS
                raise HubError(400, "BadRequest", f"Unsupported operation: {key}")
        sha = repo.commit(branch, files, message)
        return {"commitOid": sha, "commitUrl": f"{repo.url}/commit/{sha}"}

    def _resolve(self, repo: Repo, rest: list[str]) -> Response:
        if len(rest) < 3 or rest[0] != "resolve":
            raise HubError(404, "NotFound", f"No route for {self.command} {self.path}")
        revision, path = rest[1], "/".join(rest[2:])
        sha, files = repo.files(revision)
        if path not in files:  # with X-Repo-Commit, the client caches the miss
            message = f"{path} not found at {revision}"
            raise HubError(404, "EntryNotFound", message, headers={"X-Repo-Commit": sha})
        headers = {"ETag": f'"{blob_oid(files[path])}"', "X-Repo-Commit": sha}
        return files[path], {"Content-Type": "application/octet-stream", **headers}

    def _read_body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length", 0)))

    def _read_json(self) -> dict:
        return json.loads(self._read_body() or b"{}")


def _repo_info(repo: Repo, revision: str) -> dict[str, object]:
    sha, files = repo.files(revision)
    siblings = [
        {"rfilename": path, "size": len(data), "blobId": blob_oid(data)} for path, data in sorted(files.items())
    ]
    info = {"id": repo.repo_id, "sha": sha, "private": repo.private}
    return {**info, "author": repo.repo_id.split("/")[0], "siblings": siblings}


def _json(payload: object) -> Response:
    return json.dumps(payload).encode(), {"Content-Type": "application/json"}


# Variables that would beat HF_HOME (cache locations) or HF_ENDPOINT (offline switches), here or in children.
_OVERRIDING_ENV = (
    *("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_ASSETS_CACHE", "HF_XET_CACHE", "HF_TOKEN_PATH", "HF_MODULES_CACHE"),
    *("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"),
)


def hub_env(endpoint: str, hf_home: str | os.PathLike[str], token: str = FAKE_TOKEN) -> dict[str, str]:
    """A copy of ``os.environ`` for a child process that uses the Hub at `endpoint`."""
    env = {k: v for k, v in os.environ.items() if k not in _OVERRIDING_ENV}
    return env | {"HF_ENDPOINT": endpoint, "HF_HOME": os.fspath(hf_home), "HF_TOKEN": token}


@contextmanager
def patch_hub_client(endpoint: str, hf_home: str | os.PathLike[str], token: str = FAKE_TOKEN) -> Iterator[None]:
    """Make this process use the Hub at `endpoint` and cache in `hf_home`, until exit.

    Sets ``os.environ`` as :func:`hub_env` does (child processes inherit it), and patches
    the values huggingface_hub and transformers already read from it when imported.
    """
    from huggingface_hub import constants, hf_api
    from transformers import dynamic_module_utils
    from transformers.utils import hub as transformers_hub

    home = os.fspath(hf_home)
    modules = os.path.join(home, "modules")
    url_template = endpoint + "/{repo_id}/resolve/{revision}/{filename}"
    patches = [
        (constants, "ENDPOINT", endpoint),
        (constants, "HUGGINGFACE_CO_URL_TEMPLATE", url_template),
        (constants, "HF_HOME", home),
        (constants, "HF_HUB_CACHE", os.path.join(home, "hub")),
        (constants, "HF_ASSETS_CACHE", os.path.join(home, "assets")),
        (constants, "HF_XET_CACHE", os.path.join(home, "xet")),
        (constants, "HF_TOKEN_PATH", os.path.join(home, "token")),
        (constants, "HF_STORED_TOKENS_PATH", os.path.join(home, "stored_tokens")),
        (constants, "HF_HUB_OFFLINE", False),
        (hf_api.api, "endpoint", endpoint),  # behind huggingface_hub.create_repo & co
        (transformers_hub, "_hf_api", None),  # transformers' shared HfApi, made on use
        (transformers_hub, "HF_MODULES_CACHE", modules),  # where remote code goes
        (dynamic_module_utils, "HF_MODULES_CACHE", modules),
    ]
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    env = hub_env(endpoint, home, token)
    names = ("HF_ENDPOINT", "HF_HOME", "HF_TOKEN", *_OVERRIDING_ENV)
    saved_env = {name: os.environ.get(name) for name in names}
    for obj, name, value in patches:
        setattr(obj, name, value)
    for name in saved_env:
        _set_env(name, env.get(name))
    try:
        yield
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)
        for name, value in saved_env.items():
            _set_env(name, value)
        if modules in sys.path:  # added by transformers when it loaded remote code
            sys.path.remove(modules)
        for name in [n for n in sys.modules if n.split(".")[0] == "transformers_modules"]:
            del sys.modules[name]


def _set_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


if __name__ == "__main__":
    with FakeHub() as hub:
        print(f"export HF_ENDPOINT={hub.url} HF_TOKEN={FAKE_TOKEN} HF_HOME=$(mktemp -d)", flush=True)
        threading.Event().wait()
