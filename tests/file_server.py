"""A static file server on 127.0.0.1 that answers like S3 (HEAD, `Range`), for the published models' tests: no
network in tests."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class FileServer:
    """Static files over HTTP with HEAD and `Range` (as S3 answers), recording each request as (method, path,
    Range header); `body` replaces a file's bytes on GET (the announced size stays the file's)."""

    files: dict[str, bytes]
    body: dict[str, bytes] = field(default_factory=dict)
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_HEAD(self) -> None:
                self.answer(head=True)

            def do_GET(self) -> None:
                self.answer(head=False)

            def answer(self, head: bool) -> None:
                path = self.path.removeprefix("/elmo/")
                server.requests.append((self.command, path, self.headers.get("Range")))
                if path not in server.files:
                    self.send_error(404)
                    return
                data = server.files[path] if head else server.body.get(path, server.files[path])
                start = int(self.headers["Range"].removeprefix("bytes=").split("-")[0]) if self.headers.get(
                    "Range") else 0
                self.send_response(206 if start else 200)
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.send_header("Content-Length", str(len(data) - start))
                self.end_headers()
                if not head:
                    self.wfile.write(data[start:])

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/elmo"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        """Stop serving and close the listening socket."""
        self.server.shutdown()
        self.server.server_close()

    def gets(self, path: str) -> list[str | None]:
        """The Range headers of the GETs of `path`."""
        return [header for method, requested, header in self.requests if method == "GET" and requested == path]


def published_files(options: bytes, weights: bytes) -> dict[str, bytes]:
    """The same options and weights under every published model's paths (`ELMO_PUBLISHED_ENDPOINT` = the server's
    url)."""
    from hf_elmo.published import ALLENNLP_MODELS

    return {path: data for model in ALLENNLP_MODELS.values()
            for path, data in ((model.options_path, options), (model.weights_path, weights))}
