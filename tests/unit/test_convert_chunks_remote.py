"""The Ray engine's chunks of a bucket's files (moto's S3 server on 127.0.0.1): cut at line starts with ranged
reads, every byte in exactly one chunk, a .gz file streamed whole, their lines counted, as the same files on a
local disk."""

from __future__ import annotations

import os

from _convert_engines import sample_lines, write_text
from test_storage import BUCKET, moto_server, s3  # noqa: F401  (moto's server and its environment: fixtures)

from rayemb import storage
from rayemb.convert.chunks import chunk_lines, count_lines, plan_chunks, text_blocks


def _texts(chunks):
    return [b"".join(bytes(b) for b in text_blocks(c, block_size=4096)) for c in chunks]


def test_chunks_of_bucket_files_equal_those_of_local_files(s3, tmp_path):
    lines = sample_lines()
    local = [write_text(tmp_path / "day_0", lines), write_text(tmp_path / "day_1.gz", lines[:50], compress=True)]
    remote = [f"s3://{BUCKET}/chunks/{os.path.basename(p)}" for p in local]
    for p, uri in zip(local, remote):
        storage.upload_file(p, uri)
    for kind in (local, remote):
        chunks = plan_chunks([(p, "rows") for p in kind], chunk_bytes=8192)
        assert [c.file_index for c in chunks].count(1) == 1 and chunks[-1].whole_file  # the .gz: one stream
        texts = _texts(chunks)
        assert b"".join(texts[:-1]) == "".join(ln + "\n" for ln in lines).encode()
        assert sum(count_lines(t) for t in texts[:-1]) == 200 and count_lines(texts[-1]) == 50
        assert [chunk_lines(c, block_size=4096) for c in chunks] == [count_lines(t) for t in texts]
        assert all(t.endswith(b"\n") for t in texts)  # every chunk ends where a line ends
        if kind is local:
            want = [(c.start, c.end) for c in chunks]
    assert [(c.start, c.end) for c in plan_chunks([(p, "rows") for p in remote], chunk_bytes=8192)] == want
