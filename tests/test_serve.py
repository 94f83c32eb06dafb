"""`elmo serve` against real server processes on 127.0.0.1: the clients people use (huggingface_hub's
InferenceClient, openai's) get the library's vectors; TEI's routes and shapes; requests batched together; every limit
and fault answered in one JSON line with its status (401, 413, 422, 429, 424), a client that goes away freeing its
place, SIGTERM answering what is held; memory flat over many requests. On Ray Serve (`--ray`): a local cluster that
listens on loopback only and is gone with the server; on two nodes, requests spread over the replicas, one replica
killed mid-load, the other answering, every answer its own input's vector.

A server whose stream a test must hold or make fail is `tests/serve_app.py` (the same app, its stream's work
wrapped: a gate file holds its advances, and sentences with the word FAIL fail); every server is ended with its test
(`processes`)."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest
from elmo_fixtures import server_port
from processes import Processes, kill_session, session_processes
from ray_clusters import RAY_ENV, ray_environment, two_nodes
from typer.testing import CliRunner

from elmo_cli import app
from hf_elmo.embed import ElmoEmbedder
from hf_elmo.serve import ServeOptions
from hf_elmo.serve.server import run
from hf_elmo.text import split_into_words

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
SERVE_APP = Path(__file__).with_name("serve_app.py")
TEXTS = ["The bank raised rates.", "We sat on the river bank .", "", "café au lait", "a " * 30]


def started(processes: Processes, command: list, env: dict | None = None, timeout: float = 180) -> str:
    """A server process of `command` (its port in the URL it is given), once /health answers; its URL."""
    port = server_port()
    command = [str(part).replace("{port}", str(port)) for part in command]
    process = processes.start(command, env=env or ENV)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            pytest.fail(f"the server ended ({process.returncode}): {process.communicate()[1][-3000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return url
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            kill_session(process)
            pytest.fail(f"the server did not answer /health in {timeout} s: {process.communicate()[1][-3000:]}")
        time.sleep(0.1)


def elmo_serve(model: object, *options: object) -> list:
    return [sys.executable, "-m", "elmo_cli", "serve", model, "--port", "{port}", *options]


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    """`elmo serve` of the tiny model, for the module."""
    processes = Processes()
    try:
        yield started(processes, elmo_serve(tiny_model_dir, "--max-client-batch-size", 8, "--payload-limit", 20_000,
                                            "--max-batch-tokens", 40))
    finally:
        processes.end()


@pytest.fixture(scope="module")
def library(tiny_model_dir):
    """What the library gives: per text its `/embed` vector (unnormalised) and its word vectors."""
    embedder = ElmoEmbedder(tiny_model_dir, layers="average", pool="mean")
    words = embedder.with_settings(pool=None)

    def vectors(text: str) -> tuple[np.ndarray, np.ndarray]:
        sentence = split_into_words(text, embedder.tokenizer.word_tokenizer)
        return embedder.embed_sentence(sentence), words.embed_sentence(sentence)

    return vectors


def unit(vector: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(vector)
    return vector / norm if norm else vector


def post(url: str, path: str, body: object, **options) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{url}{path}", content=content, headers={"content-type": "application/json",
                                                                **options.pop("headers", {})}, timeout=60, **options)


def one_line_error(response: httpx.Response, status: int, error_type: str, openai: bool = False) -> str:
    assert response.status_code == status, (response.status_code, response.text)
    assert "\n" not in response.text
    body = response.json()
    if openai:
        assert set(body["error"]) == {"message", "type", "param", "code"} and body["error"]["type"] == error_type
        return body["error"]["message"]
    assert set(body) == {"error", "error_type"} and body["error_type"] == error_type, body
    return body["error"]


def test_the_clients_people_use_get_the_librarys_vectors(server, library):
    from huggingface_hub import InferenceClient
    from openai import OpenAI

    expected = [library(text) for text in TEXTS]
    vectors = InferenceClient(base_url=server).feature_extraction(TEXTS)
    assert vectors.shape == (len(TEXTS), 16)
    for got, (pooled, _) in zip(vectors, expected):
        np.testing.assert_allclose(got, unit(pooled), atol=1e-5, rtol=0)
    client = OpenAI(base_url=f"{server}/v1", api_key="unused")
    for encoding in ("float", "base64"):
        answer = client.embeddings.create(input=TEXTS, model="elmo", encoding_format=encoding)
        assert [item.index for item in answer.data] == list(range(len(TEXTS))) and answer.model == "elmo"
        for item, (pooled, _) in zip(answer.data, expected):
            got = item.embedding if encoding == "float" else np.frombuffer(base64.b64decode(item.embedding), "<f4")
            np.testing.assert_allclose(np.asarray(got, dtype=np.float32), unit(pooled), atol=1e-5, rtol=0)
    words = sum(len(split_into_words(t, None)) for t in TEXTS)
    assert answer.usage.prompt_tokens == answer.usage.total_tokens == words


def test_the_readmes_calls_to_elmo_serve_run_as_written(processes, tmp_path):
    """The README's serving section against `elmo serve` of the default model (its address put in place of
    127.0.0.1:3000): every curl line answers 200 with its route's JSON, the Python block prints what it says."""
    import shlex
    import shutil

    from spacy_fixtures import REPO, blocks
    from test_readme import SERVER

    url = started(processes, elmo_serve("default"))
    readme = REPO / "README.md"
    curls = [line for code in blocks(readme, "bash") for line in code.splitlines() if line.startswith("curl ")]
    assert len(curls) == 4 and shutil.which("curl"), "curl is needed"
    for line in curls:
        words = [word.replace(SERVER, url.removeprefix("http://")) for word in shlex.split(line)]
        answer = subprocess.run([*words, "-w", "\n%{http_code}"], capture_output=True, text=True, timeout=60)
        body, _, status = answer.stdout.rpartition("\n")
        assert status == "200" and json.loads(body), (line, answer.stdout[-500:], answer.stderr)
    (code,) = [code for code in blocks(readme, "python") if SERVER in code]
    script = tmp_path / "clients.py"
    script.write_text(code.replace(SERVER, url.removeprefix("http://")), encoding="utf-8")
    client_env = {name: value for name, value in ENV.items() if name != "HF_HUB_OFFLINE"}  # it would refuse the URL
    printed = subprocess.run([sys.executable, script], capture_output=True, text=True, env=client_env, timeout=120)
    assert printed.stdout.splitlines() == ["(1, 512)", "2 512"], printed.stderr[-2000:]


def test_teis_routes_and_shapes(server, library):
    pooled, words = library(TEXTS[0])
    for path in ("/embed", "/", "/invocations"):
        answer = post(server, path, {"inputs": TEXTS[0], "normalize": False})
        assert answer.status_code == 200
        np.testing.assert_allclose(np.array(answer.json()), [pooled], atol=1e-5, rtol=0)
    answer = post(server, "/embed_all", {"inputs": [TEXTS[0], TEXTS[2]]}).json()
    np.testing.assert_allclose(np.array(answer[0]), words, atol=1e-5, rtol=0)
    assert answer[1] == []
    tokens = post(server, "/tokenize", {"inputs": "The bank, rose."}).json()[0]
    assert [(t["text"], t["special"], t["start"], t["stop"]) for t in tokens] == [
        ("<S>", True, None, None), ("The", False, 0, 3), ("bank", False, 4, 8), (",", False, 8, 9),
        ("rose", False, 10, 14), (".", False, 14, 15), ("</S>", True, None, None)]
    info = httpx.get(f"{server}/info").json()
    assert info["max_client_batch_size"] == 8 and info["max_batch_tokens"] == 40 and info["settings"]["pool"] == "mean"
    assert httpx.get(f"{server}/ping").status_code == 200 and httpx.get(f"{server}/docs").status_code == 200
    metrics = httpx.get(f"{server}/metrics").text
    assert 'elmo_requests_total{route="/embed",status="200"}' in metrics and "elmo_joined_words_bucket" in metrics


def test_bad_requests_are_one_json_line_with_their_status(server):
    assert "8 inputs" not in one_line_error(post(server, "/embed", {"inputs": ["a"] * 9}), 413, "validation")
    assert one_line_error(post(server, "/embed", {"inputs": ["a"] * 9}), 413, "validation").startswith(
        "9 inputs in one request; at most 8 (--max-client-batch-size)")
    assert "--payload-limit" in one_line_error(post(server, "/embed", {"inputs": "a" * 30_000}), 413, "validation")
    long = " ".join(["word"] * 41)
    assert one_line_error(post(server, "/embed", {"inputs": long}), 413, "validation").startswith(
        "input 0 has 41 words; at most 40 (--max-batch-tokens)")
    assert post(server, "/embed", {"inputs": long, "truncate": True}).status_code == 200
    for body, message in ((b"{not json", "the body is not JSON"), (b'{"inputs": "caf\xe9"}', "the body is not UTF-8"),
                          ({"text": "a"}, "inputs is missing"), ({"inputs": 3}, "inputs"),
                          ({"inputs": ["a", 3]}, "inputs"), ({"inputs": []}, "inputs is an empty list")):
        error_type = "empty" if body == {"inputs": []} else "validation"
        assert message in one_line_error(post(server, "/embed", body), 422, error_type)
    message = one_line_error(post(server, "/v1/embeddings", {"input": [[1, 2]]}), 422, "validation", openai=True)
    assert message.startswith("input")
    assert httpx.get(f"{server}/nowhere").status_code == 404


@pytest.fixture
def held(tmp_path, tiny_model_dir, processes):
    """`held(**options)`: a `serve_app.py` server whose stream's advances wait while its gate file exists; (url,
    gate)."""

    def start(**options) -> tuple[str, Path]:
        gate = tmp_path / f"gate-{len(processes.started)}"
        url = started(processes, [sys.executable, SERVE_APP, tiny_model_dir, "{port}", json.dumps(options)],
                      env={**ENV, "ELMO_TEST_GATE": str(gate)})
        return url, gate

    return start


def gauge(url: str, name: str) -> float:
    """A gauge of /metrics (`elmo_queue_sentences`: waiting to join the stream; `elmo_running_sentences`: in it)."""
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    raise AssertionError(f"no {name}")


def queued(url: str) -> float:
    return gauge(url, "elmo_queue_sentences")


def running(url: str) -> float:
    return gauge(url, "elmo_running_sentences")


def histogram(url: str, name: str) -> tuple[float, float]:
    """(count, sum) of a histogram of /metrics: `elmo_joined_sentences` (groups of sentences that joined the stream
    together, their sentences), `elmo_advance_sentences` (advances, the sentences each held)."""
    found = {}
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith((f"{name}_count ", f"{name}_sum ")):
            found[line.split()[0]] = float(line.split()[1])
    return found.get(f"{name}_count", 0.0), found.get(f"{name}_sum", 0.0)


def joined(url: str) -> tuple[float, float]:
    return histogram(url, "elmo_joined_sentences")


def wait_until(condition, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
    return value


async def concurrently(url: str, bodies: list[dict], path: str = "/embed") -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        return await asyncio.gather(*(client.post(path, json=body) for body in bodies))


def test_concurrent_requests_are_batched_together_and_each_gets_its_own_vectors(held, library):
    """The first sentence's advance held: the others queue, then join the stream together, beside it; every answer
    is its own input's vectors."""
    url, gate = held(max_batch_tokens=4096)
    gate.touch()
    texts = [f"sentence {i} with {'more ' * (i % 7)}words" for i in range(12)]

    async def run() -> list[httpx.Response]:
        first = asyncio.ensure_future(concurrently(url, [{"inputs": texts[0], "normalize": False}]))
        await asyncio.to_thread(wait_until, lambda: running(url) == 1)  # held in the stream
        rest = asyncio.ensure_future(concurrently(url, [{"inputs": t, "normalize": False} for t in texts[1:]]))
        await asyncio.to_thread(wait_until, lambda: queued(url) == len(texts) - 1)
        gate.unlink()
        return [*(await first), *(await rest)]

    answers = asyncio.run(run())
    assert joined(url) == (2.0, 12.0)  # the held one, then the 11 that queued meanwhile, together
    advances, held_sentences = histogram(url, "elmo_advance_sentences")
    assert held_sentences > advances  # advances held several sentences at once
    for text, answer in zip(texts, answers):
        np.testing.assert_allclose(np.array(answer.json()[0]), library(text)[0], atol=1e-5, rtol=0)


def test_with_two_threads_requests_at_once_share_the_streams_steps_and_each_gets_its_own_vectors(tiny_model_dir,
                                                                                                 processes, library):
    """`elmo serve --threads 2`: 40 requests at once join the stream as they come and leave as they end
    (test_batching.py holds the rule); every request gets its own input's vectors."""
    url = started(processes, elmo_serve(tiny_model_dir, "--threads", 2))
    texts = [f"request {i} about {'more ' * (i % 5)}rivers and banks" for i in range(40)]
    for _ in range(2):
        answers = asyncio.run(concurrently(url, [{"inputs": text, "normalize": False} for text in texts]))
        for text, answer in zip(texts, answers):
            np.testing.assert_allclose(np.array(answer.json()[0]), library(text)[0], atol=1e-5, rtol=0)
    assert joined(url)[1] == 2 * len(texts)


def test_over_the_concurrent_requests_429_at_once_and_a_client_that_goes_away_frees_its_place(held):
    """Three places: two requests held in the stream and one raw client take them; a fourth gets 429 at once. The
    raw client goes away: its sentence leaves the queue and its place takes a new request."""
    url, gate = held(max_concurrent_requests=3)
    gate.touch()

    async def run() -> None:
        held_requests = asyncio.ensure_future(concurrently(url, [{"inputs": "one"}, {"inputs": "two"}]))
        await asyncio.to_thread(wait_until, lambda: running(url) + queued(url) == 2)
        with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1]))) as raw:
            body = b'{"inputs": "gone"}'
            raw.sendall(b"POST /embed HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: "
                        + str(len(body)).encode() + b"\r\n\r\n" + body)
            await asyncio.to_thread(wait_until, lambda: running(url) + queued(url) == 3)
            started_at = time.monotonic()
            over = await concurrently(url, [{"inputs": "four"}])
            assert time.monotonic() - started_at < 5
            assert "its most (--max-concurrent-requests)" in one_line_error(over[0], 429, "overloaded")
        await asyncio.to_thread(wait_until, lambda: running(url) + queued(url) == 2)
        after = asyncio.ensure_future(concurrently(url, [{"inputs": "after"}]))
        await asyncio.to_thread(wait_until, lambda: running(url) + queued(url) == 3)
        gate.unlink()
        assert [r.status_code for r in [*(await held_requests), *(await after)]] == [200, 200, 200]

    asyncio.run(run())
    assert joined(url)[1] == 3.0  # "gone" was dropped from the queue: one, two and after joined


def test_sentences_that_fail_fail_their_requests_with_424_and_the_server_goes_on(held):
    url, _ = held()
    answer = post(url, "/embed", {"inputs": ["fine", "this will FAIL here"]})
    assert one_line_error(answer, 424, "backend") == ("the biLM failed on this request: sentences that fail (FAIL in "
                                                      "one)")
    message = one_line_error(post(url, "/v1/embeddings", {"input": "FAIL"}), 424, "backend", openai=True)
    assert message.startswith("the biLM failed on this request")
    assert post(url, "/embed", {"inputs": "fine again"}).status_code == 200


@pytest.mark.parametrize("ray", [False, True], ids=["in this process", "--ray"])
def test_an_address_taken_or_not_this_machines_is_one_line_and_nothing_is_announced(tiny_model_dir, monkeypatch,
                                                                                     ray):
    """A port another server listens on, or a --hostname that is not this machine's: exit 1, one line naming the
    address and what to do, nothing announced; with --ray, before a local cluster starts."""
    for name, value in RAY_ENV.items():
        monkeypatch.setenv(name, value)
    runner = CliRunner(env={"COLUMNS": "1000"})
    command = ["serve", str(tiny_model_dir), *(["--ray"] if ray else [])]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = runner.invoke(app, [*command, "--port", str(port)])
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr == (f"Error: 127.0.0.1:{port} is in use (another server listens there): stop it, or pass "
                             "another --port\n")
    result = runner.invoke(app, [*command, "--hostname", "198.51.100.7", "--port", str(port)])  # TEST-NET-2
    assert result.exit_code == 1 and result.stderr.count("\n") == 1, result.output
    assert result.stderr.startswith(f"Error: cannot listen on 198.51.100.7:{port}: ")
    assert result.stderr.endswith(": pass a --hostname of this machine (127.0.0.1, 0.0.0.0, or one of its addresses) "
                                  "and a --port it may use\n")


def test_port_0_is_announced_as_the_port_the_system_picked_and_freed_when_the_server_ends_early():
    announced = []

    class Stop(Exception):
        pass

    def announce(url: str) -> None:
        announced.append(url)
        raise Stop

    with pytest.raises(Stop):
        run(object(), ServeOptions(port=0), announce)
    (url,) = announced
    port = int(url.removeprefix("http://127.0.0.1:"))
    assert port > 0
    with socket.socket() as again:  # closed with the run: the port is free again
        again.bind(("127.0.0.1", port))


@pytest.mark.parametrize("port", ["free", 0])
def test_a_local_ray_serve_cluster_starts_with_the_serving_port_held_then_given_to_serve(monkeypatch, port):
    """While a local cluster starts, the serving port is this process's, listening: none of the cluster's processes
    can take it, even binding as Ray's own servers and uvicorn do (SO_REUSEADDR), nor get it from the kernel as a
    free port; Serve gets it once the cluster is up (--port 0: the port the system picked, announced as such)."""
    import contextlib

    from ray import serve

    from hf_elmo.embed import EmbedSettings
    from hf_elmo.serve import ray_serve

    class Stop(Exception):
        pass

    def taken(number: int) -> bool:
        with socket.socket() as other:
            other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                other.bind(("127.0.0.1", number))
            except OSError:
                return True
            return False

    def listening_ports() -> set[int]:
        return {c.laddr.port for c in psutil.Process().net_connections("tcp") if c.status == psutil.CONN_LISTEN}

    before = listening_ports()  # a fixture's server in this worker, say

    def listening() -> set[int]:
        """The ports this process listens on that the call opened."""
        return listening_ports() - before

    seen = {}

    @contextlib.contextmanager
    def cluster(ray, address):
        (seen["held"],) = listening()
        seen["taken while the cluster starts"] = taken(seen["held"])
        yield {"CPU": 2.0}

    def start(proxy_location, http_options):
        seen["given"] = http_options["port"]
        seen["taken when Serve starts"], seen["listening"] = taken(http_options["port"]), listening()
        raise Stop

    monkeypatch.setattr(ray_serve, "ray_cluster", cluster)
    monkeypatch.setattr(ray_serve, "_stop_event", threading.Event)
    monkeypatch.setattr(serve, "start", start)
    monkeypatch.setattr(serve, "shutdown", lambda: None)
    number = server_port() if port == "free" else 0
    with pytest.raises(Stop):
        ray_serve.serve_on_ray("default", EmbedSettings(), ServeOptions(port=number))
    assert seen["given"] == seen["held"] == (number or seen["held"]) and seen["held"] > 0
    assert seen["taken while the cluster starts"] and not seen["taken when Serve starts"] and not seen["listening"]


def test_port_0_with_an_existing_ray_cluster_is_one_line():
    from hf_elmo.embed import EmbedSettings
    from hf_elmo.serve.options import ServeError
    from hf_elmo.serve.ray_serve import serve_on_ray

    with pytest.raises(ServeError, match=r"^--port 0 picks a free port of this machine, but with --ray-address Serve "
                                         r"listens on the cluster's head node: pass its --port$"):
        serve_on_ray("default", EmbedSettings(), ServeOptions(port=0), address="ray://head:10001")


def test_with_an_api_key_nothing_is_computed_without_it(tiny_model_dir, processes):
    url = started(processes, elmo_serve(tiny_model_dir, "--api-key", "s3cret"))
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "s3cret"}):
        one_line_error(post(url, "/embed", {"inputs": "a"}, headers=headers), 401, "unauthorized")
        one_line_error(post(url, "/v1/embeddings", {"input": "a"}, headers=headers), 401, "unauthorized", openai=True)
    assert httpx.get(f"{url}/health").status_code == 200  # probes stay open
    metrics = httpx.get(f"{url}/metrics", headers={"authorization": "Bearer s3cret"}).text
    assert "elmo_joined_sentences_count 0.0" in metrics
    assert post(url, "/embed", {"inputs": "a"}, headers={"authorization": "Bearer s3cret"}).status_code == 200
    server = processes.started[-1]
    server.send_signal(signal.SIGTERM)
    assert server.wait(timeout=60) == 0  # `elmo serve`'s normal stop
    assert f"serving {tiny_model_dir} on http://127.0.0.1:{url.rsplit(':', 1)[1]}" in server.stderr.read()


def test_sigterm_stops_taking_requests_answers_those_held_then_exits(held, processes):
    """SIGTERM to the server's whole process group (as a service manager or Ctrl-C sends it): the requests held are
    answered, then the server exits 0 and no process of it is left."""
    url, gate = held()
    gate.touch()
    server = processes.started[-1]

    async def run() -> list[httpx.Response]:
        pending = asyncio.ensure_future(concurrently(url, [{"inputs": "held one"}, {"inputs": "held two"}]))
        await asyncio.to_thread(wait_until, lambda: running(url) + queued(url) == 2)
        os.killpg(server.pid, signal.SIGTERM)
        await asyncio.to_thread(wait_until, lambda: _refused(url))
        gate.unlink()
        return await pending

    assert [answer.status_code for answer in asyncio.run(run())] == [200, 200]
    assert server.wait(timeout=60) == 0
    assert wait_until(lambda: not session_processes(server.pid), timeout=30)


def _refused(url: str) -> bool:
    try:
        httpx.get(f"{url}/health", timeout=2)
    except httpx.TransportError:
        return True
    return False


def test_memory_stays_flat_over_many_requests(server):
    """After a warm-up, 1,500 more requests of new words add no memory that grows with them (the caches are
    bounded)."""
    pid = next(p.pid for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] and "serve" in p.info["cmdline"]
               and str(server.rsplit(":", 1)[1]) in p.info["cmdline"])
    process = psutil.Process(pid)

    async def run(start: int, count: int) -> None:
        async with httpx.AsyncClient(base_url=server, timeout=60) as client:
            for first in range(start, start + count, 50):
                answers = await asyncio.gather(*(client.post("/embed", json={"inputs": f"w{i} x{i % 97} y{i * 7}"})
                                                 for i in range(first, first + 50)))
                assert {a.status_code for a in answers} == {200}

    asyncio.run(run(0, 500))
    before = process.memory_info().rss
    asyncio.run(run(500, 1500))
    assert process.memory_info().rss - before < 30 << 20, (before, process.memory_info().rss)


# -- on Ray Serve ---------------------------------------------------------------------------------------------------

RAY_SERVE_ENV = {**ENV, **RAY_ENV}
# A Serve app's start on two one-CPU nodes: 13 s on an idle 2-core machine, 207 s for the whole two-node test with two
# `yes` hogging both cores, and over 240 s once in a CI run with one `yes` beside the other worker's tests.
RAY_SERVE_START_SECONDS = 600


def listening(leader: int) -> set[tuple[str, str, int]]:
    """(process name, address, port) of each socket the processes of the session `leader` listen on."""
    return {(member.name(), connection.laddr.ip, connection.laddr.port) for member in session_processes(leader)
            for connection in member.net_connections(kind="inet") if connection.status == psutil.CONN_LISTEN}


def loopback(address: str) -> bool:
    import ipaddress

    ip = ipaddress.ip_address(address.split("%")[0])
    return ip.is_loopback or (ip.version == 6 and ip.ipv4_mapped is not None and ip.ipv4_mapped.is_loopback)


@pytest.mark.xdist_group("ray")
def test_on_a_local_ray_serve_cluster_every_socket_is_on_loopback_and_sigterm_leaves_nothing(tiny_model_dir,
                                                                                           processes, library):
    """`elmo serve --ray` without an address: its cluster's GCS, raylet, Serve's controller, proxy and replicas
    (and the replicas' own gRPC servers) listen on loopback, the serving port among them; answers are the library's;
    SIGTERM: exit 0, no process left."""
    url = started(processes, elmo_serve(tiny_model_dir, "--ray", "--replicas", 1), env=RAY_SERVE_ENV,
                  timeout=RAY_SERVE_START_SECONDS)
    driver = processes.started[-1]
    answer = post(url, "/embed", {"inputs": TEXTS[0], "normalize": False})
    np.testing.assert_allclose(np.array(answer.json()[0]), library(TEXTS[0])[0], atol=1e-5, rtol=0)
    sockets = listening(driver.pid)
    names = {name for name, _, _ in sockets}
    assert {"gcs_server", "raylet"} <= names and any(name.startswith("ray::ServeRepli") for name in names), sockets
    assert int(url.rsplit(":", 1)[1]) in {port for _, _, port in sockets}
    assert all(loopback(ip) for _, ip, _ in sockets), sorted(sockets)
    driver.send_signal(signal.SIGTERM)
    assert driver.wait(timeout=120) == 0, driver.stderr.read()
    deadline = time.monotonic() + 60
    while session_processes(driver.pid):
        assert time.monotonic() < deadline, [p.name() for p in session_processes(driver.pid)]
        time.sleep(0.1)


@pytest.fixture(scope="module")
def cluster():
    """Two nodes whose Serve proxy routes each request to the less busy of the replicas (Serve's power of two
    choices) rather than to its own node's replica first: with its own node first, how fast a replica answers
    decides whether requests ever reach the other node (a run saw 20 bursts of 8 requests at once all answered on the
    proxy's node)."""
    with ray_environment(RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING="0"), two_nodes() as address:
        yield address


def replicas_alive() -> list:
    """The live replica actors of the app (Ray's own record of its actors), as handles."""
    import ray
    from ray._private import state
    from ray.serve._private.constants import SERVE_NAMESPACE

    return [ray.get_actor(actor["Name"], namespace=SERVE_NAMESPACE) for actor in state.actors().values()
            if actor["ActorClassName"] == "ServeReplica:elmo:elmo" and actor["State"] == "ALIVE"]


@pytest.mark.xdist_group("ray")
def test_on_two_nodes_requests_spread_and_a_replica_killed_mid_load_loses_no_ones_vectors(cluster, tiny_model_dir,
                                                                                         processes, library):
    """Two replicas, one a node, each taking 4 requests at once, routed by their load (`cluster`): bursts of 8
    requests at once until both replicas have answered; then 8 clients send 240 requests of distinct texts, and after
    60 answers one replica is killed.
    Every answer of 200 is its own input's vector; at most the requests in flight on the killed replica fail, and the
    other replica (then the one Serve starts again) answers the rest."""
    import ray

    url = started(processes, elmo_serve(tiny_model_dir, "--ray", "--ray-address", cluster, "--replicas", 2,
                                             "--max-concurrent-requests", 4),
                  env=RAY_SERVE_ENV, timeout=RAY_SERVE_START_SECONDS)
    texts = [f"request {i} about {i % 11} banks and {i % 7} rivers" for i in range(240)]
    expected = {text: library(text)[0] for text in texts}
    answers: dict[int, tuple[int, str | None, list | None]] = {}
    killed: list[float] = []

    async def bursts() -> set[str]:
        seen: set[str] = set()
        async with httpx.AsyncClient(base_url=url, timeout=120) as session:
            for _ in range(20):
                burst = await asyncio.gather(*(session.post("/embed", json={"inputs": texts[i]}) for i in range(8)))
                assert {response.status_code for response in burst} == {200}
                seen |= {response.headers["x-elmo-replica"] for response in burst}
                if len(seen) == 2:
                    break
        return seen

    assert len(asyncio.run(bursts())) == 2  # both replicas answer

    async def client(worker: int) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=120) as session:
            for i in range(worker, len(texts), 8):
                response = await session.post("/embed", json={"inputs": texts[i], "normalize": False})
                answers[i] = (response.status_code, response.headers.get("x-elmo-replica"),
                              response.json() if response.status_code == 200 else None)
                if len(answers) == 60 and not killed:
                    replica = replicas_alive()[0]
                    ray.kill(replica, no_restart=True)
                    killed.append(len(answers))

    async def load() -> None:
        await asyncio.gather(*(client(worker) for worker in range(8)))

    asyncio.run(load())
    assert killed
    for i, (status, _, vectors) in answers.items():
        if status == 200:
            np.testing.assert_allclose(np.array(vectors[0]), expected[texts[i]], atol=1e-5, rtol=0)
    failed = [status for status, _, _ in answers.values() if status != 200]
    assert len(failed) <= 8, failed  # at most the requests in flight on the killed replica
    late = [answers[i][0] for i in sorted(answers)[-120:]]
    assert late.count(200) >= 112, late
    driver = processes.started[-1]
    driver.send_signal(signal.SIGTERM)
    assert driver.wait(timeout=120) == 0, driver.stderr.read()
    assert not replicas_alive()  # the app deleted; Serve stays, the cluster's own
