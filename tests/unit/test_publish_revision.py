"""Changing one file of a published output (moto's S3 server on 127.0.0.1): a new version, never an edit.

``rayemb schema infer --force`` on a published dataset writes schema.yaml into a new version (the other files
copied on the store) and switches the marker to it; readers then pass every file check, and the version a job
resolved before still reads as it was. A change whose base version was replaced meanwhile is refused.
"""

from __future__ import annotations

import threading

from test_convert import criteo_rows, run, write_tsv
from test_publish import _read_all, _rows, _stage
from test_storage import BUCKET, moto_server, s3  # noqa: F401  (moto's server and its environment: fixtures)

from rayemb import publish, storage
from rayemb.cli import main
from rayemb.data.schema import load_checked
from rayemb.errors import DataError
from rayemb.publish import publish_dir, publish_revision, read_marker, resolve, resolve_dataset

WAIT_S = 120


def test_schema_infer_force_on_a_published_dataset_publishes_a_new_version(s3, tmp_path, capsys):
    out = f"s3://{BUCKET}/infer/criteo"
    assert run("criteo", "--input", write_tsv(tmp_path / "day_0", criteo_rows()), "--out", out,
               "--hash-buckets", 97) == 0
    old, before = resolve_dataset(out), read_marker(out)
    old_schema, rows = storage.read_text(f"{old}/schema.yaml"), _rows(old)
    capsys.readouterr()

    assert main(["schema", "infer", out]) == 2 and "--force" in capsys.readouterr().err
    assert main(["schema", "infer", out, "--force"]) == 0
    new = resolve_dataset(out)  # every file the new marker lists is there, with its size
    after = read_marker(out)
    assert new != old and after["replaces"] == before["version"] and list(after["retired"]) == [before["version"]]
    new_schema = storage.read_text(f"{new}/schema.yaml")
    assert new_schema != old_schema and f"wrote {new}/schema.yaml" in capsys.readouterr().out
    assert after["files"] == {**before["files"], "schema.yaml": len(new_schema.encode())}
    assert len(load_checked(new).sparse) == 26 and _rows(new) == rows

    # a job that resolved the old version before the switch reads it as it was
    assert storage.read_text(f"{old}/schema.yaml") == old_schema and _rows(old) == rows
    assert load_checked(old).sparse[0].num_embeddings == 97

    # --out naming the file under the output (not its version): the same, one more version
    assert main(["schema", "infer", out, "--out", f"{out}/schema.yaml"]) == 2
    assert main(["schema", "infer", out, "--out", f"{out}/schema.yaml", "--force", "--exclude", "C26"]) == 0
    assert resolve_dataset(out) != new and len(load_checked(resolve_dataset(out)).sparse) == 25
    assert not storage.exists(f"{out}/schema.yaml")  # nothing written next to the marker


def test_a_change_to_a_version_replaced_meanwhile_is_refused(s3, tmp_path, monkeypatch):
    out = f"s3://{BUCKET}/revision/out"
    publish_dir(_stage(tmp_path / "s0", {"schema.yaml": b"one", "train/a.bin": b"a" * 10}), out)
    real, replaced = publish.write_marker, []

    def replaced_meanwhile(dest, doc, *tag):
        if threading.current_thread().name == "change" and not replaced:
            def overwrite():
                replaced.append(publish_dir(_stage(tmp_path / "s1", {"schema.yaml": b"two"}), out, overwrite=True))

            other = threading.Thread(target=overwrite)
            other.start()
            other.join(WAIT_S)
        return real(dest, doc, *tag)

    monkeypatch.setattr(publish, "write_marker", replaced_meanwhile)
    refused = []

    def change():
        try:
            publish_revision(out, {"schema.yaml": b"changed"})
        except DataError as e:
            refused.append(e)

    t = threading.Thread(target=change, name="change")
    t.start()
    t.join(WAIT_S)
    (e,) = refused
    assert e.category == "output_conflict" and "was replaced" in e.message
    assert resolve(out) == replaced[0] and _read_all(replaced[0]) == {"schema.yaml": b"two"}
    assert len(storage.listdir(f"{out}/_v")) == 2  # the refused change removed its own version
