"""`bucket load`'s bulk path: LocalBucket.load_rows gives what write gives, and the fast line reader accepts
and rejects exactly what the general one does."""

from __future__ import annotations

import json
import random

import msgpack

from eventing.cli import main
from eventing.core.mutation import OP_DELETE, OP_UPDATE, encode_document
from eventing.storage import loadgen
from eventing.storage.bucket import LocalBucket
from eventing.storage.values import Write


def _log(bucket: LocalBucket) -> list[tuple]:
    rows = bucket.file.db.execute(
        "SELECT vb, seqno, key, op, doc, origin, expiry, flags FROM log ORDER BY vb, seqno"
    )
    return rows.fetchall()


def _docs(bucket: LocalBucket) -> list[tuple]:
    return bucket.file.db.execute(
        "SELECT key, vb, seqno, deleted, doc, expiry FROM docs ORDER BY key"
    ).fetchall()


def test_load_rows_matches_write_batch_by_batch(data_dir):
    """Same writes, same batches: the same log, documents and high seqnos, including deletes of missing
    documents (skipped), deletes and re-creates of a key within one batch, and expiries."""
    rng = random.Random(3)
    batches = []
    for _ in range(4):
        batch = []
        for _ in range(300):
            key = f"k{rng.randrange(60)}"
            if rng.random() < 0.3:
                batch.append(Write(key, OP_DELETE))
            else:
                batch.append(Write(key, OP_UPDATE, encode_document({"v": rng.random()}), rng.choice([0, 99])))
        batches.append(batch)
    a = LocalBucket.create(data_dir, "a")
    b = LocalBucket.create(data_dir, "b")
    for batch in batches:
        results = a.write(batch)
        written = b.load_rows([(w.key, w.op, w.doc, w.expiry) for w in batch])
        assert written == sum(1 for r in results if r is not None)
    assert _log(a) == _log(b)
    assert _docs(a) == _docs(b)
    assert a.high_seqnos() == b.high_seqnos()
    cas = [r[0] for r in b.file.db.execute("SELECT cas FROM log ORDER BY cas")]
    assert len(set(cas)) == len(cas)  # every entry has its own cas


def test_load_rows_arrival_never_goes_backwards(data_dir):
    bucket = LocalBucket.create(data_dir, "a")
    bucket.load_rows([("x", OP_UPDATE, encode_document({}), 0)], arrival_ms=5_000)
    bucket.load_rows(
        [("x", OP_UPDATE, encode_document({}), 0), ("y", OP_UPDATE, encode_document({}), 0)], arrival_ms=1_000
    )
    arrivals = dict(
        ((k, s), a) for k, s, a in bucket.file.db.execute("SELECT key, seqno, arrival_ms FROM log")
    )
    assert arrivals[("x", 1)] == 5_000 and arrivals[("x", 2)] == 5_000  # same vBucket: kept at 5000
    assert arrivals[("y", 1)] == 1_000  # another vBucket: its own time


def test_load_file_gives_the_generator_bytes_and_the_same_rejections(capsys, data_dir, tmp_path):
    lines = [
        json.dumps(
            {"key": w.key, "doc": msgpack.unpackb(w.doc)}
            if w.op == OP_UPDATE
            else {"key": w.key, "op": "delete"}
        )
        for w in loadgen.generate(40, 300, seed=4)
    ]
    lines += [  # after the generated lines, so those keep their seqnos
        "",  # blank: skipped
        '{"key": "n", "doc": {"x": NaN}}',  # rejected by both readers
        '{"key": "big", "doc": {"x": 123456789012345678901234567890}}',
        '{"key": "null", "doc": null}',  # accepted: any JSON value, as `bucket upsert` takes it
        '{"key": "e", "doc": {"x": 1}, "expiry": 5.0, "meta": {"vb": 1}}',  # accepted: the general path
        '{"key": "u", "doc": {"s": "\\u00e9\\ud83d\\ude00"}}',
        '{"key": "d", "op": "drop"}',
        '{"key": 7, "doc": {}}',
    ]
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(lines) + "\n")
    assert main(["bucket", "create", "f", "--data-dir", data_dir]) == 0
    capsys.readouterr()
    assert main(["bucket", "load", "f", "--file", str(path), "--data-dir", data_dir, "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    rejected = "\n".join(out["rejected"])
    assert len(out["rejected"]) == 4, rejected
    assert "line 302: not valid JSON" in rejected or "line 302: document field" in rejected
    assert "line 303: a number is out of range" in rejected
    assert "line 307: unknown op 'drop'" in rejected
    assert "line 308: key 7 is a int" in rejected
    bucket = LocalBucket.open(data_dir, "f")
    assert bucket.get("e") == {"x": 1} and bucket.get_meta("e")["expiry"] == 5
    assert bucket.get("u") == {"s": "\u00e9\U0001f600"}
    assert bucket.get("null") == b"null"  # its JSON text, as `bucket upsert k null` stores it
    # The generator's own documents: the same msgpack bytes as loading them without the file.
    assert main(["bucket", "create", "g", "--data-dir", data_dir]) == 0
    assert (
        main(
            [
                "bucket",
                "load",
                "g",
                "--documents",
                "40",
                "--mutations",
                "300",
                "--seed",
                "4",
                "--data-dir",
                data_dir,
            ]
        )
        == 0
    )
    generated = LocalBucket.open(data_dir, "g")
    keep = {r[2] for r in _log(generated)}
    assert [r for r in _log(bucket) if r[2] in keep] == _log(generated)


def test_export_writes_every_document_as_its_json_value_and_load_reads_it_back(data_dir, capsys):
    """A document that is not a JSON object (an array, a string, a number, null, text, binary) is exported
    as its value, not as a Python repr ("b'[1,2]'"), and `bucket load --file` of the export puts back the
    same documents, as `bucket get` shows them."""
    dd = ["--data-dir", data_dir]

    def cli(*argv: str) -> str:
        code = main([*dd, *argv])
        out, err = capsys.readouterr()
        assert code == 0, err
        return out

    cli("bucket", "create", "src")
    given = {
        "obj": '{"a":1,"b":[true,null]}',
        "arr": "[1,2]",
        "str": '"h\\u00e9llo"',
        "num": "3.5",
        "nil": "null",
    }
    for key, text in given.items():
        cli("bucket", "upsert", "src", key, text)
    source = LocalBucket.open(data_dir, "src")
    source.upsert("bin", b"\xff\x00binary")  # as the Data API stores a binary document
    source.upsert("txt", b"plain, not JSON")
    source.close()

    scanned = {line["key"]: line for line in map(json.loads, cli("bucket", "scan", "src").splitlines())}
    assert {k: scanned[k]["doc"] for k in given} == {k: json.loads(t) for k, t in given.items()}
    assert scanned["bin"]["datatype"] == "binary" and scanned["txt"] == {
        **scanned["txt"],
        "doc": "plain, not JSON",
        "datatype": "text",
    }
    exported = f"{data_dir}/src.jsonl"
    cli("bucket", "export", "src", "-o", exported)
    with open(exported) as lines:
        assert [json.loads(line) for line in lines] == list(scanned.values())  # the same lines as scan

    cli("bucket", "create", "copy")
    assert "loaded 7 mutations" in cli("bucket", "load", "copy", "--file", exported)
    for key in [*given, "bin", "txt"]:
        original = json.loads(cli("bucket", "get", "src", key, "--json"))
        copy = json.loads(cli("bucket", "get", "copy", key, "--json"))
        assert (copy["doc"], copy.get("datatype")) == (original["doc"], original.get("datatype")), key
    assert cli("bucket", "get", "copy", "arr") == "[\n  1,\n  2\n]\n"


def test_load_takes_the_values_upsert_takes_and_names_a_bad_datatype(data_dir, capsys, tmp_path):
    lines = tmp_path / "lines.jsonl"
    lines.write_text(
        '{"key":"a","doc":[1,2]}\n{"key":"s","doc":"x"}\n{"key":"n","doc":7}\n'
        '{"key":"bad","doc":"@@","datatype":"binary"}\n{"key":"odd","doc":{"a":1},"datatype":"yaml"}\n'
    )
    LocalBucket.create(data_dir, "b").close()
    code = main(["--data-dir", data_dir, "bucket", "load", "b", "--file", str(lines)])
    _, err = capsys.readouterr()
    assert code == 1
    assert 'line 4: "doc" of a "binary" document must be base64' in err
    assert 'line 5: "datatype" "yaml" is not known' in err
    bucket = LocalBucket.open(data_dir, "b")
    assert [bucket.get(k) for k in ("a", "s", "n", "bad", "odd")] == [b"[1,2]", b'"x"', b"7", None, None]
    bucket.close()
