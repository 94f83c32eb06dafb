"""The server's ASGI app (FastAPI): ELMo behind Text Embeddings Inference's HTTP API and OpenAI's embeddings API, so
that their clients (`huggingface_hub.InferenceClient`, `openai`, LangChain, LlamaIndex) call it unchanged.

Routes (TEI's request and response shapes): `POST /embed` (one vector per input: the settings' sentence vector,
unit length with `normalize`), `POST /embed_all` (each input's word vectors), `POST /v1/embeddings` and `/embeddings`
(OpenAI's), `POST /` and `/invocations` (as `/embed`), `POST /tokenize` (the model's words), `GET /health`, `/ping`,
`/info`, `/metrics` (Prometheus), `/docs`. Every input's vectors are what `ElmoEmbedder` gives for the same text with
the same settings, whatever requests it is batched with (`batching.Streamer`).

Every error is one JSON line: TEI's `{"error": ..., "error_type": ...}`, OpenAI's `{"error": {"message", "type",
"param", "code"}}` on its routes: 401 without the API key (nothing computed), 413 a body over `payload_limit`, more
inputs than `max_client_batch_size` or an input too long, 422 a body that is not JSON of the route's shape (invalid
UTF-8, no input, an input that is not text, an empty list), 429 over `max_concurrent_requests` (at once, never
queued), 424 a request whose sentences failed in the biLM (the server goes on).
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import orjson
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.datastructures import Headers

from ..text import split_into_words
from ..tokenization_elmo import word_spans
from .batching import BatchFailed, Streamer, StreamWork
from .metrics import Metrics
from .options import ServeOptions

OPENAI_ROUTES = ("/v1/embeddings", "/embeddings")


class ApiError(Exception):
    """An answer other than 200: its status, one line, and TEI's error type."""

    def __init__(self, status: int, message: str, error_type: str):
        super().__init__(message)
        self.status, self.message, self.error_type = status, message, error_type


class EmbedRequest(BaseModel):
    """TEI's `/embed` and `/embed_all` body."""

    model_config = ConfigDict(extra="ignore")
    inputs: str | list[str]
    normalize: bool = True
    truncate: bool | None = None
    truncation_direction: Literal["right", "left", "Right", "Left"] = "right"
    prompt_name: None = None


class OpenAIRequest(BaseModel):
    """OpenAI's `/v1/embeddings` body (text inputs; token ids are not ELMo's)."""

    model_config = ConfigDict(extra="ignore")
    input: str | list[str]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None


class TokenizeRequest(BaseModel):
    """TEI's `/tokenize` body."""

    model_config = ConfigDict(extra="ignore")
    inputs: str | list[str]
    add_special_tokens: bool = True


def create_app(embedder: Any, options: ServeOptions, make_work: Callable[[], StreamWork] | None = None) -> FastAPI:
    """The app serving `embedder` (an `ElmoEmbedder`; its settings give `/embed`'s vector, its layers `/embed_all`'s)
    within `options`. `make_work` makes what each lane of the stream runs (an `EmbedderStream` of `embedder` by
    default; tests wrap it to hold an advance or make sentences fail)."""
    from ..embed.streaming import EmbedderStream

    metrics = Metrics()
    lanes, threads, set_threads = _lanes(embedder)
    streamer = Streamer(make_work or (lambda: EmbedderStream(embedder)), options.max_batch_tokens, lanes, threads,
                        set_threads, metrics.joined, metrics.advanced)
    state = {"serving": 0}

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        streamer.start()
        yield
        await streamer.stop()

    app = FastAPI(title="ELMo embeddings", description=__doc__.split("\n\n")[0], lifespan=lifespan)
    app.state.metrics, app.state.streamer = metrics, streamer

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError) -> Response:
        return _error_response(request.url.path, error)

    app.add_middleware(Guard, options=options, metrics=metrics, state=state)

    _embedding_routes(app, _Serving(embedder, options, streamer))

    @app.get("/health", summary="200 once the model is loaded and its stream runs")
    async def health() -> Response:
        if not streamer.alive:
            raise ApiError(503, "the stream does not run", "unhealthy")
        return Response(status_code=200)

    @app.get("/ping", summary="As /health (SageMaker's)")
    async def ping() -> Response:
        return await health()

    @app.get("/info", summary="The model, its settings and the server's limits")
    async def info() -> Response:
        return _json(_info(embedder, options))

    @app.get("/metrics", summary="Prometheus metrics")
    async def prometheus() -> Response:
        return PlainTextResponse(metrics.exposition(streamer.queued, streamer.running, state["serving"]),
                                 media_type=metrics.content_type)

    return app


@dataclass(frozen=True)
class _Serving:
    """What the embedding routes share: the embedder, the server's limits, the stream."""

    embedder: Any
    options: ServeOptions
    streamer: Streamer

    def sentences(self, inputs: str | list[str], truncate: bool | None,
                  direction: str = "right") -> tuple[list[str], list[list[str]]]:
        """The request's texts and their words, within the limits (413, 422; too long: cut with `truncate`)."""
        texts = [inputs] if isinstance(inputs, str) else list(inputs)
        if not texts:
            raise ApiError(422, "inputs is an empty list: send at least one text", "empty")
        options = self.options
        if len(texts) > options.max_client_batch_size:
            raise ApiError(413, f"{len(texts)} inputs in one request; at most {options.max_client_batch_size} "
                           "(--max-client-batch-size): send them in several requests", "validation")
        sentences = [split_into_words(text, self.embedder.tokenizer.word_tokenizer) for text in texts]
        cut = options.auto_truncate if truncate is None else truncate
        limit = options.max_batch_tokens
        for index, words in enumerate(sentences):
            if len(words) > limit:
                if not cut:
                    raise ApiError(413, f"input {index} has {len(words)} words; at most {limit} (--max-batch-tokens): "
                                   "send shorter inputs, or truncate=true", "validation")
                sentences[index] = words[-limit:] if direction.lower() == "left" else words[:limit]
        return texts, sentences

    async def computed(self, request: Request, sentences: list[list[str]]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per sentence its float32 word vectors and its vector (`EmbedderStream`), from the stream; a client that
        goes away frees its place."""
        work = asyncio.ensure_future(self.streamer.vectors(sentences))
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            done, _ = await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
            if work not in done:
                work.cancel()
                raise ApiError(499, "the client closed the request", "cancelled")
            return work.result()
        except BatchFailed as error:
            raise ApiError(424, f"the biLM failed on this request: {error}", "backend") from None
        finally:
            gone.cancel()


def _embedding_routes(app: FastAPI, serving: _Serving) -> None:
    """The POST routes: TEI's /embed (also at / and /invocations), /embed_all and /tokenize, OpenAI's embeddings."""
    embedder, options = serving.embedder, serving.options

    def route(path: str, model: type[BaseModel], **kwargs: Any) -> Callable:
        extra = {"requestBody": {"content": {"application/json": {"schema": model.model_json_schema()}},
                                 "required": True}}
        return app.post(path, openapi_extra=extra, **kwargs)

    async def embed_route(request: Request) -> Response:
        body = await _body(request, EmbedRequest, options)
        _, sentences = serving.sentences(body.inputs, body.truncate, body.truncation_direction)
        vectors = [pooled for _, pooled in await serving.computed(request, sentences)]
        return _json([_normalized(v) if body.normalize else _floats(v) for v in vectors])

    for path in ("/embed", "/", "/invocations"):
        route(path, EmbedRequest, summary="One vector per input (TEI's /embed)",
              name=f"embed{path.replace('/', '_')}")(embed_route)

    @route("/embed_all", EmbedRequest, summary="Each input's word vectors (TEI's /embed_all)")
    async def embed_all(request: Request) -> Response:
        body = await _body(request, EmbedRequest, options)
        _, sentences = serving.sentences(body.inputs, body.truncate, body.truncation_direction)
        vectors = [words for words, _ in await serving.computed(request, sentences)]
        return _json([_floats(np.moveaxis(v.astype(embedder.dtype), -2, 0)) for v in vectors])

    async def openai_route(request: Request) -> Response:
        body = await _body(request, OpenAIRequest, options)
        width = embedder.layout.token_shape[-1]
        if body.dimensions is not None and body.dimensions != width:
            raise ApiError(422, f"dimensions: this model's vectors have {width}; ask for those or leave it out",
                           "validation")
        _, sentences = serving.sentences(body.input, None)
        vectors = [_normalized(pooled) for _, pooled in await serving.computed(request, sentences)]
        data = [{"object": "embedding", "index": i, "embedding": _openai_vector(v, body.encoding_format)}
                for i, v in enumerate(vectors)]
        words = sum(len(s) for s in sentences)
        return _json({"object": "list", "data": data, "model": body.model or options.model_id,
                      "usage": {"prompt_tokens": words, "total_tokens": words}})

    for path in OPENAI_ROUTES:
        route(path, OpenAIRequest, summary="OpenAI's embeddings", name=f"openai{path.replace('/', '_')}")(
            openai_route)

    @route("/tokenize", TokenizeRequest, summary="The model's words of each input (TEI's /tokenize)")
    async def tokenize(request: Request) -> Response:
        body = await _body(request, TokenizeRequest, options)
        texts, sentences = serving.sentences(body.inputs, True)
        return _json([_tokens(text, words, body.add_special_tokens, embedder.tokenizer)
                      for text, words in zip(texts, sentences)])


class Guard:
    """Around every request (a plain ASGI middleware, no task of its own): the API key (401), the place a POST takes
    among `max_concurrent_requests` (429 past them, at once), and the request's metrics by its route's path (a
    client's unknown paths one label: no label grows with the requests)."""

    def __init__(self, app: Any, options: ServeOptions, metrics: Metrics, state: dict[str, int]):
        self.app, self.options, self.metrics, self.state = app, options, metrics, state

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started, status = time.perf_counter(), 500

        async def sending(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            _authorize(scope, self.options)
            if scope["method"] != "POST":
                await self.app(scope, receive, sending)
            elif self.state["serving"] >= self.options.max_concurrent_requests:
                raise ApiError(429, f"the server is serving {self.state['serving']} requests, its most "
                               "(--max-concurrent-requests): retry later", "overloaded")
            else:
                self.state["serving"] += 1
                try:
                    await self.app(scope, receive, sending)
                finally:
                    self.state["serving"] -= 1
        except ApiError as error:
            await _error_response(scope["path"], error)(scope, receive, sending)
        route = scope.get("route")
        self.metrics.request_done(route.path if route is not None else "unmatched", status,
                                  time.perf_counter() - started)


def _lanes(embedder: Any) -> tuple[int, int, Callable[[int], None]]:
    """The stream's lanes, torch's threads in all, and what gives a lane's thread its share (OpenMP's setting is per
    thread): on a CPU a lane a torch thread, on a GPU one lane with all of them. All of torch's work, the pooling
    included, runs on the lanes' threads: the event loop's thread running torch ops would start an OpenMP team beside
    theirs, on the cores they use (docs/serving.md)."""
    import torch

    threads = torch.get_num_threads()
    return (threads if embedder.device.type == "cpu" else 1), threads, torch.set_num_threads


async def _body(request: Request, model: type[BaseModel], options: ServeOptions) -> Any:
    """The request's JSON body as `model`, read within `payload_limit` (413) and checked (422)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > options.payload_limit:
        raise ApiError(413, f"the body has {declared} bytes; at most {options.payload_limit} (--payload-limit)",
                       "validation")
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > options.payload_limit:
            raise ApiError(413, f"the body has more than {options.payload_limit} bytes (--payload-limit)",
                           "validation")
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError as error:
        raise ApiError(422, f"the body is not UTF-8 (byte {error.start}): send JSON in UTF-8", "validation") from None
    try:
        return model.model_validate(json.loads(text))
    except ValueError as error:  # json's errors and pydantic's ValidationError
        raise ApiError(422, _validation_message(error), "validation") from None


def _validation_message(error: ValueError) -> str:
    if not isinstance(error, ValidationError):
        return f"the body is not JSON ({error})"
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"] if not str(part).startswith(("str", "list[")))
    if first["type"] == "missing":
        return f"{where} is missing"
    return f"{where or 'the body'}: {first['msg']}".replace("Input should be", "should be")


async def _disconnected(request: Request) -> None:
    """Returns when the client has gone away (after the body, the next ASGI message is the disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _authorize(scope: dict, options: ServeOptions) -> None:
    if options.api_key is None or scope["path"] in ("/health", "/ping"):
        return
    scheme, _, key = Headers(scope=scope).get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or key != options.api_key:
        raise ApiError(401, "no valid API key: send the header `Authorization: Bearer <key>`", "unauthorized")


def _error_response(path: str, error: ApiError) -> Response:
    if path in OPENAI_ROUTES:
        content = {"error": {"message": error.message, "type": error.error_type, "param": None,
                             "code": str(error.status)}}
    else:
        content = {"error": error.message, "error_type": error.error_type}
    return _json(content, error.status)


def _json(content: Any, status: int = 200) -> Response:
    """`content` as JSON (orjson: its arrays as float32 numbers, each the shortest text that reads back the same)."""
    return Response(orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY), status_code=status,
                    media_type="application/json")


def _floats(array: np.ndarray) -> np.ndarray:
    """`array` as JSON takes it: float32, C-contiguous."""
    return np.ascontiguousarray(array, dtype=np.float32)


def _normalized(vector: np.ndarray) -> np.ndarray:
    """Unit length along the last axis (a zero vector stays zero), float32."""
    vector = _floats(vector)
    norm = np.linalg.norm(vector, axis=-1, keepdims=True)
    return vector / np.where(norm > 0, norm, 1)


def _openai_vector(vector: np.ndarray, encoding_format: str) -> Any:
    flat = vector.astype("<f4").reshape(-1)
    return base64.b64encode(flat.tobytes()).decode("ascii") if encoding_format == "base64" else _floats(flat)


def _tokens(text: str, words: Sequence[str], special: bool, tokenizer: Any) -> list[dict[str, Any]]:
    """TEI's tokens of one input: its words (`id`: the position), where each is in the text, and the boundaries."""
    try:
        spans: list[tuple[int | None, int | None]] = list(word_spans(text, words))
    except ValueError:  # a word tokenizer that changed a word's text
        spans = [(None, None)] * len(words)
    tokens = [{"text": word, "special": False, "start": start, "stop": stop}
              for word, (start, stop) in zip(words, spans)]
    if special:
        tokens = [{"text": str(tokenizer.bos_token), "special": True, "start": None, "stop": None}, *tokens,
                  {"text": str(tokenizer.eos_token), "special": True, "start": None, "stop": None}]
    return [{"id": i, **token} for i, token in enumerate(tokens)]


def _info(embedder: Any, options: ServeOptions) -> dict[str, Any]:
    """TEI's `/info`, and the settings the vectors are made with."""
    from .. import __version__

    settings = embedder.settings
    return {
        "model_id": options.model_id, "model_sha": None, "model_dtype": settings.dtype,
        "model_type": {"embedding": {"pooling": settings.pool or "mean"}},
        "max_concurrent_requests": options.max_concurrent_requests, "max_input_length": options.max_batch_tokens,
        "max_batch_tokens": options.max_batch_tokens, "max_batch_requests": None,
        "max_client_batch_size": options.max_client_batch_size, "auto_truncate": options.auto_truncate,
        "payload_limit": options.payload_limit, "tokenization_workers": 1, "version": __version__,
        "settings": settings.to_dict(), "dimensions": embedder.layout.token_shape[-1],
    }
