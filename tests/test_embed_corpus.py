"""Corpus-scale outputs without Ray: the Parquet layout and `read_vectors`, what pyarrow, pandas, polars and DuckDB read
of it, one vector per sentence (`pool`, defined as the spaCy component's `Doc.vector`), float16 in every writer, the
inputs (JSON Lines, Parquet, globs and directories) and their bad cases, and `ElmoBatchEmbedder` under each batch kind
and under Hugging Face datasets."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from elmo_fixtures import message_words
from typer.testing import CliRunner

from elmo_cli import app
from hf_elmo import split_words
from hf_elmo.embed import ElmoEmbedder, InputError, Sentence, embed_file, open_writer, read_vectors
from hf_elmo.embed.batches import ElmoBatchEmbedder
from hf_elmo.embed.reading import InputFile, count_rows, input_files, read_span, read_texts, split_rows
from hf_elmo.formulas import pool_words

pytestmark = pytest.mark.usefixtures("one_torch_thread")
runner = CliRunner(env={"COLUMNS": "1000"})
TEXTS = ["The bank of the river .", "", "He sat on the bank , again and again .", "café au lait", "a"]
LAYOUTS = {  # (layers, pool) → the shape of a sentence of n words
    ("all", None): lambda n: (3, n, 16), ("top", None): lambda n: (n, 16), ("all", "mean"): lambda n: (3, 16),
    ("average", "max"): lambda n: (16,),
}


def cli(*args: object):
    return runner.invoke(app, [str(a) for a in args])


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize(("layers", "pool"), list(LAYOUTS))
def test_parquet_rows_hold_what_the_embedder_gives_and_every_reader_reads_them(tiny_model, tmp_path, layers, pool,
                                                                                 dtype):
    import duckdb
    import pandas as pd
    import polars as pl

    source = tmp_path / "in.txt"
    source.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    embedder = ElmoEmbedder(tiny_model, layers=layers, pool=pool, dtype=dtype)
    assert embed_file(embedder, source, tmp_path / "out.parquet", tokenized=True, progress=False,
                      metadata={"model": "tiny"}) == len(TEXTS)
    expected = list(embedder.embed_sentences([text.split() for text in TEXTS]))
    vectors = read_vectors(tmp_path / "out.parquet")
    assert len(vectors) == len(TEXTS)
    for text, got, want in zip(TEXTS, vectors, expected):
        assert got.shape == want.shape == LAYOUTS[layers, pool](len(text.split())) and got.dtype == np.dtype(dtype)
        assert np.array_equal(got, want)
    np.testing.assert_array_equal(read_vectors(tmp_path / "out.parquet", row=2), expected[2])
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.column_names == ["source", "line", "text", "words", "vectors"]
    assert table.column("source").to_pylist() == [str(source)] * len(TEXTS)
    assert table.column("line").to_pylist() == list(range(len(TEXTS)))
    assert table.column("words").to_pylist() == [text.split() for text in TEXTS]
    metadata = json.loads(table.schema.metadata[b"elmo"])
    assert metadata == {"schema": 1, "num_layers": 3 if layers == "all" else None, "width": 16,
                        "pooled": pool is not None, "dtype": dtype, "model": "tiny"}
    # Plain nested lists: pandas, polars and DuckDB read them without this package.
    frame = pd.read_parquet(tmp_path / "out.parquet")
    np.testing.assert_array_equal(np.stack(frame["vectors"][2]) if layers != "all" or pool else
                                  np.stack([np.stack(layer) for layer in frame["vectors"][2]]), expected[2])
    polars_row = pl.read_parquet(tmp_path / "out.parquet")["vectors"][2].to_list()
    np.testing.assert_allclose(np.array(polars_row, dtype=np.float32), expected[2].astype(np.float32))
    first = duckdb.sql(f"SELECT vectors FROM '{tmp_path / 'out.parquet'}' WHERE line = 2").fetchall()[0][0]
    np.testing.assert_allclose(np.array(first, dtype=np.float32), expected[2].astype(np.float32))


@pytest.mark.slow
def test_spark_reads_the_float32_layout_and_refuses_parquets_float16(tiny_model, tmp_path):
    """Spark (4.x, a JVM of its own) reads the nested lists as arrays of arrays of floats; it has no type for Parquet's
    FLOAT16, which docs/performance.md says (pyarrow, pandas, polars and DuckDB read it)."""
    from pyspark.sql import SparkSession

    source = tmp_path / "in.txt"
    source.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    for dtype in ("float32", "float16"):
        embed_file(ElmoEmbedder(tiny_model, dtype=dtype), source, tmp_path / f"{dtype}.parquet", tokenized=True,
                   progress=False)
    spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "1").getOrCreate())
    try:
        rows = spark.read.parquet(str(tmp_path / "float32.parquet")).orderBy("line").collect()
        expected = read_vectors(tmp_path / "float32.parquet")
        assert [row["text"] for row in rows] == TEXTS
        for row, vectors in zip(rows, expected, strict=True):
            np.testing.assert_array_equal(np.array(row["vectors"], dtype=np.float32).reshape(vectors.shape), vectors)
        with pytest.raises(Exception, match="FLOAT16"):
            spark.read.parquet(str(tmp_path / "float16.parquet")).collect()
    finally:
        spark.stop()


def test_read_vectors_of_a_table_slice_and_of_a_directory_of_shards(tiny_model, tmp_path):
    embedder = ElmoEmbedder(tiny_model)
    (tmp_path / "shards").mkdir()
    for part, texts in enumerate((TEXTS[:2], TEXTS[2:])):
        with open_writer(tmp_path / "shards" / f"part-{part:05d}.parquet", embedder.layout) as writer:
            for line, (text, vectors) in enumerate(zip(texts, embedder.embed_sentences([t.split() for t in texts]))):
                writer.add(vectors, Sentence("x", line, text, text.split()))
    (tmp_path / "shards" / "_elmo_embed.json").write_text("{}")  # skipped by readers, as a job's manifest is
    expected = [embedder.embed_sentences([t.split() for t in texts]) for texts in (TEXTS[:2], TEXTS[2:])]
    expected = [vectors for part in expected for vectors in part]  # as the shards' batches were
    whole = read_vectors(tmp_path / "shards")
    assert all(np.array_equal(a, b) for a, b in zip(whole, expected, strict=True))
    table = pq.read_table(tmp_path / "shards").slice(1, 3)
    assert all(np.array_equal(a, b) for a, b in zip(read_vectors(table), expected[1:4], strict=True))
    with pytest.raises(IndexError, match="row 9 of 5"):
        read_vectors(tmp_path / "shards", row=9)


def test_the_mean_pool_is_the_spacy_components_doc_vector_and_max_the_max(elmo_dir):
    from spacy_fixtures import elmo_pipeline

    doc = elmo_pipeline(elmo_dir)("The bank of the river, and then a second, quite long clause follows.")
    words = [token.text for token in doc if not token.is_space]
    embedder = ElmoEmbedder(elmo_dir, layers="average", pool="mean")  # the component's default mix: the average
    np.testing.assert_allclose(embedder.embed_sentence(words), doc.vector, atol=1e-6, rtol=0)
    vectors = ElmoEmbedder(elmo_dir, layers="average").embed_sentence(words)
    np.testing.assert_array_equal(embedder.with_settings(pool="max").embed_sentence(words), vectors.max(axis=0))
    # A long sentence's windows pool as one sentence of all their words.
    long_words = words * 30
    windowed = ElmoEmbedder(elmo_dir, layers="top", max_sentence_words=50)
    windows = [windowed.embed_sentence(long_words[start : start + 50]) for start in range(0, len(long_words), 50)]
    for pool in ("mean", "max"):
        pooled = next(windowed.with_settings(pool=pool).embed_sentences([long_words]))
        by_definition = pool_words([torch.from_numpy(window) for window in windows], pool).numpy()
        np.testing.assert_allclose(pooled, by_definition, atol=1e-6, rtol=0)
    np.testing.assert_allclose(by_definition, np.concatenate(windows).max(axis=0), atol=0, rtol=0)
    assert pool_words([torch.zeros(3, 0, 4)], "max").shape == (3, 4)  # no words: zeros
    assert not pool_words([torch.zeros(0, 4)], "mean").any()
    with pytest.raises(ValueError, match='pool must be "mean" or "max"'):
        pool_words([torch.zeros(2, 4)], "sum")


def test_float16_and_pooled_vectors_in_every_writer(tiny_model_dir, tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    full = ElmoEmbedder(tiny_model_dir, layers="top")
    expected = list(full.embed_sentences([split_words(t) for t in TEXTS]))
    for name in ("out.npy", "out.hdf5", "out.parquet"):
        for extra, shape in ((["--dtype", "float16"], None), (["--pool", "max", "--dtype", "float16"], (16,))):
            output = tmp_path / name
            result = cli("embed", tiny_model_dir, source, output, "--layers", "top", *extra, "-q")
            assert result.exit_code == 0, result.output
            if name.endswith(".npy"):
                vectors = np.load(output)
                assert vectors.dtype == np.float16
                if shape is None:
                    offsets = np.load(output.with_suffix(".offsets.npy"))
                    got = [vectors[a:b] for a, b in zip(offsets[:-1], offsets[1:])]
                else:  # one row per sentence, no offsets
                    assert not output.with_suffix(".offsets.npy").exists() and vectors.shape == (len(TEXTS), 16)
                    got = list(vectors)
                output.with_suffix(".offsets.npy").unlink(missing_ok=True)
            elif name.endswith(".hdf5"):
                with h5py.File(output) as file:
                    got = [file[str(i)][()] for i in range(len(TEXTS))]
                    assert all(file[str(i)].dtype == np.float16 for i in range(len(TEXTS)))
            else:
                got = read_vectors(output)
            want = [(e.max(axis=0) if len(e) else np.zeros(16, np.float32)) if shape else e for e in expected]
            for g, w in zip(got, want, strict=True):
                assert g.dtype == np.float16 and g.shape == w.shape
                np.testing.assert_array_equal(g, w.astype(np.float16))
            output.unlink()


def test_json_lines_parquet_globs_and_directories_are_read_in_order(tiny_model, tmp_path):
    (tmp_path / "corpus" / "sub").mkdir(parents=True)
    (tmp_path / "corpus" / "a.txt").write_text("one two\nthree\n", encoding="utf-8")
    with gzip.open(tmp_path / "corpus" / "b.jsonl.gz", "wt", encoding="utf-8") as handle:
        handle.write(json.dumps({"id": 1, "body": "four five"}) + "\n" + json.dumps({"body": ""}) + "\n")
    pq.write_table(pa.table({"body": ["six", "seven eight"], "n": [1, 2]}), tmp_path / "corpus" / "sub" / "c.parquet",
                   row_group_size=1)
    (tmp_path / "corpus" / ".hidden.txt").write_text("never\n")
    (tmp_path / "corpus" / "_SUCCESS").write_text("")
    sources = input_files([tmp_path / "corpus"])
    assert [(s.path.split("corpus/")[1], s.kind) for s in sources] == [
        ("a.txt", "text"), ("b.jsonl.gz", "jsonl"), ("sub/c.parquet", "parquet")]
    assert input_files([str(tmp_path / "corpus" / "*.txt")]) == [InputFile(str(tmp_path / "corpus" / "a.txt"), "text")]
    texts = [list(read_texts(s, "body")) for s in sources]
    assert texts == [["one two", "three"], ["four five", ""], ["six", "seven eight"]]
    assert list(read_texts(sources[2], "body", start=1)) == ["seven eight"]  # the first row group skipped
    embedder = ElmoEmbedder(tiny_model)
    count = embed_file(embedder, [tmp_path / "corpus"], tmp_path / "out.parquet", tokenized=True, progress=False,
                       text_column="body")
    table = pq.read_table(tmp_path / "out.parquet")
    assert count == 6 and table.column("text").to_pylist() == [t for group in texts for t in group]
    assert table.column("line").to_pylist() == [0, 1, 0, 1, 0, 1]
    for got, text in zip(read_vectors(table), table.column("text").to_pylist()):
        np.testing.assert_allclose(got, embedder.embed_sentence(text.split()), atol=1e-6, rtol=0)
    with pytest.raises(InputError, match="several inputs go into one Parquet output"):
        embed_file(embedder, [tmp_path / "corpus"], tmp_path / "out.npy", progress=False, text_column="body")


SPAN_INPUTS = {  # name -> (bytes, kind, encoding, the texts `read_texts` gives)
    "t.txt": (b"a\n\nb c\r\nlast without newline", "text", "utf-8", ["a", "", "b c", "last without newline"]),
    "t.gz": (gzip.compress(b"a\n\nb c\n\xff d\n"), "text", "utf-8", ["a", "", "b c", "\udcff d"]),
    "u16.txt": ("x\ny\nz\n".encode("utf-16"), "text", "utf-16", ["x", "y", "z"]),
    "t.jsonl": (b'{"text": "one"}\n{"text": "two", "id": 2}\n{"text": ""}\n', "jsonl", "utf-8", ["one", "two", ""]),
    "empty.txt": (b"", "text", "utf-8", []),
}


@pytest.mark.parametrize("name", [*SPAN_INPUTS, "t.parquet"])
@pytest.mark.parametrize("every", [1, 2, 3, 100])
def test_an_input_splits_into_spans_that_read_back_as_its_rows(tmp_path, name, every):
    if name == "t.parquet":
        texts = ["p one", "p two", "three", "", "five"]
        pq.write_table(pa.table({"text": texts}), tmp_path / name, row_group_size=2)
        source = InputFile(str(tmp_path / name), "parquet")
    else:
        data, kind, encoding, texts = SPAN_INPUTS[name]
        (tmp_path / name).write_bytes(data)
        source = InputFile(str(tmp_path / name), kind)
    encoding = SPAN_INPUTS.get(name, (0, 0, "utf-8"))[2]
    assert list(read_texts(source, encoding=encoding)) == texts
    assert count_rows(source, encoding=encoding) == len(texts)
    spans = split_rows(source, every, encoding=encoding)
    assert [(s.start, s.stop) for s in spans] == [(i, min(i + every, len(texts))) for i in range(0, len(texts), every)]
    assert [text for span in spans for text in read_span(source, span, encoding=encoding)] == texts
    assert len({span.digest for span in spans}) == len(spans) or every == 100
    if name in ("t.txt", "t.jsonl"):  # read as their bytes: each span starts at its first line's byte
        data = SPAN_INPUTS[name][0]
        for span in spans:
            assert data[span.offset : span.end].count(b"\n") in (span.rows, span.rows - 1)
            assert span.offset == sum(len(line) for line in data.splitlines(keepends=True)[: span.start])
    else:
        assert all(span.offset is None and span.end is None for span in spans)


@pytest.mark.parametrize("edit", ["longer line before", "same size inside", "line removed", "gzip same size",
                                  "parquet value", "lines added at the end"])
def test_a_span_whose_lines_changed_since_it_was_planned_fails_in_one_line_and_never_reads_other_lines(tmp_path, edit):
    """Known by the bytes (a digest), not by sizes and times: a same-size edit with the old mtime put back is seen."""
    lines = [f"line {i}" for i in range(30)]
    path = tmp_path / ("t.parquet" if edit == "parquet value" else "t.gz" if edit == "gzip same size" else "t.txt")
    write = {".parquet": lambda ls: pq.write_table(pa.table({"text": ls}), path),
             ".gz": lambda ls: path.write_bytes(gzip.compress("".join(f"{x}\n" for x in ls).encode(), mtime=0)),
             ".txt": lambda ls: path.write_text("".join(f"{x}\n" for x in ls), encoding="utf-8")}[path.suffix]
    write(lines)
    source = InputFile(str(path), "parquet" if path.suffix == ".parquet" else "text")
    spans = split_rows(source, 10)
    before = os.stat(path)
    changed = {"longer line before": lines[:5] + ["line 5 made longer by some bytes"] + lines[6:],
               "same size inside": lines[:15] + ["LINE 15"] + lines[16:],
               "line removed": lines[:3] + lines[4:],
               "gzip same size": lines[:15] + ["LINE 15"] + lines[16:],
               "parquet value": lines[:15] + ["LINE 15"] + lines[16:],
               "lines added at the end": lines + ["line 30", "line 31"]}[edit]
    write(changed)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    failed = []
    for span in spans:
        try:
            got = list(read_span(source, span))
        except InputError as error:
            what = (f"rows {span.start}-{span.stop - 1}" if path.suffix == ".parquet" else
                    f"lines {span.start + 1}-{span.stop}")
            assert str(error) == (f"{path} changed while the job ran: its {what} are no longer what they were when "
                                  "the job was planned (nothing of them is kept): rerun the command to plan it again")
            failed.append(span.start)
            continue
        assert got == lines[span.start : span.stop]  # a span that reads is its own lines, never another's
    # After a line of another length every later span starts at another byte: none of them reads.
    assert failed == {"longer line before": [0, 10, 20], "same size inside": [10], "line removed": [0, 10, 20],
                      "gzip same size": [10], "parquet value": [10], "lines added at the end": []}[edit]


@pytest.mark.parametrize(("name", "content", "message"), [
    ("no-column.parquet", "parquet:other", "no-column.parquet has no column 'text' (its columns: other): name the "
     "column that holds the text with --text-column"),
    ("numbers.parquet", "parquet:int", "numbers.parquet: column 'text' holds int64, not text"),
    ("empty.parquet", b"", "empty.parquet is not a Parquet file (it is empty)"),
    ("nulls.parquet", "parquet:null", "nulls.parquet: row 1: 'text' is null, not text: fix the row, drop it"),
    ("bad.jsonl", b'{"text": "fine"}\n{"text": 3}\n', "bad.jsonl: line 2: 'text' is a int, not text"),
    ("broken.jsonl", b'{"text": "fine"}\n{"text": \n', "broken.jsonl: line 2 is not JSON"),
    ("blank.jsonl", b'{"text": "fine"}\n\n', "blank.jsonl: line 2 is blank: a JSON Lines file holds one object"),
    ("missing.jsonl", b'{"body": "x"}\n', "missing.jsonl: line 1 has no field 'text' (body): name the field"),
    ("doc.json", b'{"text": "x"}', "doc.json: a .json file is one JSON document"),
    ("bytes.txt", b"fine\ncaf\xe9\n", "bytes.txt: line 2 holds bytes that are not UTF-8 (byte 0xe9)"),
])
def test_bad_input_is_one_line_naming_the_file_and_the_row_and_nothing_is_written(tiny_model_dir, tmp_path, name,
                                                                                   content, message):
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        column = {"parquet:other": pa.table({"other": ["x"]}), "parquet:int": pa.table({"text": [1, 2]}),
                  "parquet:null": pa.table({"text": ["x", None]})}[content]
        pq.write_table(column, path)
    result = cli("embed", tiny_model_dir, path, tmp_path / "out.parquet", "-q")
    assert result.exit_code == 1 and result.stderr.count("\n") == 1, result.output
    assert message in message_words(result.stderr), result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]


def test_the_batch_callable_maps_arrow_pandas_and_numpy_batches_as_the_embedder(tiny_model_dir):
    import pandas as pd

    callable_ = ElmoBatchEmbedder(tiny_model_dir, layers="top", tokenized=True, threads=1)
    embedder = ElmoEmbedder(tiny_model_dir, layers="top")
    expected = [embedder.embed_sentence(text.split()) for text in TEXTS]
    table = callable_(pa.table({"text": TEXTS, "id": range(len(TEXTS))}))
    assert table.column_names == ["text", "id", "words", "vectors"]
    assert table.schema.field("vectors").type == pa.list_(pa.list_(pa.float32(), 16))
    frame = callable_(pd.DataFrame({"text": TEXTS}))
    arrays = callable_({"text": np.array(TEXTS, dtype=object)})
    lists = callable_({"text": TEXTS})
    for got in (read_vectors(table), list(frame["vectors"]), list(arrays["vectors"]), lists["vectors"]):
        for g, e in zip(got, expected, strict=True):
            np.testing.assert_allclose(g, e, atol=1e-5, rtol=0)
    assert lists["words"] == [text.split() for text in TEXTS] and isinstance(arrays["words"], np.ndarray)
    pooled = ElmoBatchEmbedder(tiny_model_dir, layers="top", pool="mean", tokenized=True)({"text": np.array(TEXTS)})
    assert pooled["vectors"].shape == (len(TEXTS), 16)  # one shape: stacked
    with pytest.raises(KeyError, match="the batch has no column 'body'"):
        ElmoBatchEmbedder(tiny_model_dir, text_column="body")({"text": TEXTS})
    with pytest.raises(ValueError, match="pool: must be None"):
        ElmoBatchEmbedder(tiny_model_dir, pool="sum")


@pytest.mark.slow
def test_the_batch_callable_under_hf_datasets_in_one_and_two_processes(tiny_model_dir, tmp_path):
    """datasets fingerprints and, with `num_proc`, pickles the callable: it travels as its arguments and loads its
    model again in each process."""
    script = f"""
import json, sys
import numpy as np
import datasets
from hf_elmo.embed import ElmoEmbedder
from hf_elmo.embed.batches import ElmoBatchEmbedder
texts = {TEXTS!r} * 4
dataset = datasets.Dataset.from_dict({{"text": texts}})
embedder = ElmoEmbedder({str(tiny_model_dir)!r}, layers="top")
expected = [embedder.embed_sentence(t.split()) for t in texts]
for processes in (None, 2):
    mapped = dataset.map(ElmoBatchEmbedder({str(tiny_model_dir)!r}, layers="top", tokenized=True), batched=True,
                         batch_size=3, num_proc=processes)
    worst = max(float(np.abs(np.asarray(row["vectors"], dtype=np.float32).reshape(e.shape) - e).max(initial=0))
                for row, e in zip(mapped, expected))
    print(json.dumps({{"processes": processes, "rows": len(mapped), "worst": worst}}))
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, cwd=tmp_path,
                            env={**os.environ, "HF_DATASETS_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    reports = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [(r["processes"], r["rows"]) for r in reports] == [(None, 20), (2, 20)]
    assert all(r["worst"] <= 1e-5 for r in reports), reports


def test_the_batch_callable_takes_the_cpus_and_gpu_the_engine_gave_its_worker(tiny_model_dir, monkeypatch):
    """In a Ray worker (Ray's runtime context, pretended here), torch's threads are its assigned CPUs and the model
    runs on the GPU Ray made visible to it; elsewhere, as `elmo embed` chooses."""
    import types

    from hf_elmo.embed import EmbedSettingError

    assigned = {"CPU": 3.0}
    context = types.SimpleNamespace(worker=types.SimpleNamespace(mode="worker"),
                                    get_assigned_resources=lambda: assigned)
    fake_ray = types.SimpleNamespace(is_initialized=lambda: True, get_runtime_context=lambda: context,
                                     WORKER_MODE="worker", get_gpu_ids=lambda: gpus)
    monkeypatch.setitem(sys.modules, "ray", fake_ray)
    gpus: list[int] = []
    ElmoBatchEmbedder(tiny_model_dir)
    assert torch.get_num_threads() == 3
    gpus = [0]
    if torch.cuda.is_available():
        assert ElmoBatchEmbedder(tiny_model_dir).embedder.device.type == "cuda"
    else:
        with pytest.raises(EmbedSettingError, match="device: cuda was asked for"):
            ElmoBatchEmbedder(tiny_model_dir)
    assert ElmoBatchEmbedder(tiny_model_dir, device="cpu", threads=1).embedder.device.type == "cpu"
    assert torch.get_num_threads() == 1


def test_elmo_embed_resolves_the_model_name_once(tiny_model_dir, tmp_path, monkeypatch):
    from hf_elmo import loading

    calls = []
    resolve = loading.resolve_model
    monkeypatch.setattr(loading, "resolve_model", lambda *a, **k: calls.append(a) or resolve(*a, **k))
    source = tmp_path / "in.txt"
    source.write_text("a b\n", encoding="utf-8")
    result = cli("embed", tiny_model_dir, source, tmp_path / "out.npy", "-q")
    assert result.exit_code == 0, result.output
    assert len(calls) == 1, calls


def test_the_default_shard_size_gives_every_worker_several_shards_within_bounds():
    from hf_elmo.embed.shards import MAX_SHARD_SIZE, MIN_SHARD_SIZE, SHARDS_PER_WORKER, default_shard_size

    assert (SHARDS_PER_WORKER, MIN_SHARD_SIZE, MAX_SHARD_SIZE) == (4, 1000, 10_000)
    assert default_shard_size(11_283, 2) == 1411  # 8 shards: 4 per worker, the last 1,406 lines
    assert default_shard_size(236_000, 8) == 7375  # 32 shards
    assert default_shard_size(10_000_000, 2) == 10_000  # the most a shard holds: 1,000 shards
    assert default_shard_size(1595, 1) == 1000 and default_shard_size(0, 4) == 1000  # the least
