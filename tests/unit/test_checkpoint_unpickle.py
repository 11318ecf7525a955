"""A checkpoint's DCP ``.metadata`` is a pickle: rayemb reads it with an unpickler that resolves only the
classes DCP metadata holds, so a crafted checkpoint is refused before it can run code.

The checkpoint is written by rayemb's own save path (``save_logical``, a one-rank gloo group) for a
tiny model; the attacks start from its real ``.metadata``.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import shutil
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from _tiny_checkpoint import tiny_model

from rayemb.checkpoint.safe_reader import ALLOWED_GLOBALS, SafeFileSystemReader, load_metadata
from rayemb.checkpoint.reader import read_unsharded, verify
from rayemb.checkpoint.store import load_logical, save_logical
from rayemb.errors import DataError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TABLES = {"t": (6, 4)}


@pytest.fixture(scope="module")
def checkpoint(one_rank_group, tmp_path_factory):
    """(directory, model) of a real rayemb checkpoint at step 3."""
    directory = str(tmp_path_factory.mktemp("ckpt") / "checkpoint_000001")
    model, opt = tiny_model(0, stepped=True)
    save_logical(directory, model, opt, None, TABLES, {"epoch": 0, "step": 3})
    return directory, model


class _RunsCommand:
    """Unpickling this runs a shell command (what a crafted checkpoint would do)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _crafted_copy(src: str, dest: str, marker: str) -> str:
    """``src`` with a ``.metadata`` that runs a command, and a meta.json whose hashes match it."""
    shutil.copytree(src, dest)
    with open(os.path.join(src, ".metadata"), "rb") as f:
        md = pickle.load(f)  # the test's own file: trusted
    md.planner_data = _RunsCommand(marker)
    payload = pickle.dumps(md)
    with open(os.path.join(dest, ".metadata"), "wb") as f:
        f.write(payload)
    meta_path = os.path.join(dest, "meta.json")
    with open(meta_path) as f:
        meta = json.load(f)
    meta["files"][".metadata"] = {"bytes": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}
    with open(meta_path, "w") as f:
        json.dump(meta, f)
    return dest


def _globals_of(payload: bytes) -> set:
    """(module, name) of every global a (trusted) pickle resolves while it loads."""
    found = set()

    class Recording(pickle.Unpickler):
        def find_class(self, module, name):
            found.add((module, name))
            return super().find_class(module, name)

    Recording(io.BytesIO(payload)).load()
    return found


def test_a_rayemb_checkpoint_loads_through_the_restricted_unpickler(checkpoint, one_rank_group):
    directory, model = checkpoint
    with open(os.path.join(directory, ".metadata"), "rb") as f:
        payload = f.read()
    # what the file refers to is exactly what the allow-list must cover
    used = _globals_of(payload)
    assert ("torch.distributed.checkpoint.metadata", "TensorStorageMetadata") in used
    assert all(name in ALLOWED_GLOBALS.get(module, ()) or (module == "torch" and isinstance(getattr(torch, name),
                                                                                         torch.dtype))
               for module, name in used), used
    md = SafeFileSystemReader(directory).metadata()
    plain = pickle.loads(payload)
    assert {k: list(v.size) for k, v in md.state_dict_metadata.items()} == \
        {k: list(v.size) for k, v in plain.state_dict_metadata.items()}
    assert list(md.state_dict_metadata["tables.t.weight"].size) == [6, 4]
    # tensors come back equal, unsharded and into a live model through dcp.load
    flat = read_unsharded(directory)
    assert torch.equal(flat["tables.t.weight"], model.plain.embedding_bags["t"].weight.detach())
    assert torch.equal(flat["dense.top.bias"], model.top.bias.detach())
    fresh, fresh_opt = tiny_model(1, stepped=True)
    assert not torch.equal(fresh.top.weight, model.top.weight)
    meta = load_logical(directory, fresh, fresh_opt, None, TABLES)
    assert meta["step"] == 3
    assert torch.equal(fresh.top.weight, model.top.weight)
    assert torch.equal(fresh.plain.embedding_bags["t"].weight, model.plain.embedding_bags["t"].weight)


def test_a_metadata_that_would_run_a_command_is_refused(checkpoint, tmp_path):
    directory, _ = checkpoint
    marker = tmp_path / "ran"
    crafted = _crafted_copy(directory, str(tmp_path / "crafted"), str(marker))
    payload = open(os.path.join(crafted, ".metadata"), "rb").read()
    pickle.loads(payload)  # plain pickle (DCP's own reader) runs it
    assert marker.exists()
    marker.unlink()
    assert verify(crafted)["step"] == 3  # sizes and hashes match: the unpickler has to refuse it
    for read in (lambda: SafeFileSystemReader(crafted).metadata(), lambda: read_unsharded(crafted)):
        with pytest.raises(DataError) as e:
            read()
        assert e.value.category == "bad_checkpoint"
        assert os.path.join(crafted, ".metadata") in e.value.message and "posix.system" in e.value.message
        assert "trusted input" in e.value.message
        assert not marker.exists()


def _rewritten(directory: str, change) -> bytes:
    with open(os.path.join(directory, ".metadata"), "rb") as f:
        md = pickle.load(f)
    change(md)
    return pickle.dumps(md)


def _bytes_entry(md) -> None:
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    md.state_dict_metadata["dense.top.bias"] = BytesStorageMetadata()  # DCP would torch.load it unrestricted


def _outside_path(md) -> None:
    for info in md.storage_data.values():
        info.relative_path = "../elsewhere/__0_0.distcp"


@pytest.mark.parametrize("change,needle", [
    (_bytes_entry, "BytesStorageMetadata"),
    (_outside_path, "'../elsewhere/__0_0.distcp', not in a file of the checkpoint directory"),
])
def test_metadata_that_describes_more_than_tensors_in_the_directory_is_refused(checkpoint, change, needle):
    with pytest.raises(DataError) as e:
        load_metadata(_rewritten(checkpoint[0], change), "ckpt/.metadata")
    assert needle in e.value.message and "'ckpt/.metadata'" in e.value.message


def test_a_pickle_of_something_else_is_refused():
    with pytest.raises(DataError, match="holds a dict, not DCP metadata"):
        load_metadata(pickle.dumps({"state_dict_metadata": {}}), "x/.metadata")
    with pytest.raises(DataError, match="does not unpickle"):
        load_metadata(b"\x80\x04not a pickle", "x/.metadata")


def test_the_cli_refuses_a_crafted_checkpoint_in_one_paragraph(checkpoint, tmp_path):
    directory, _ = checkpoint
    marker = tmp_path / "ran"
    crafted = _crafted_copy(directory, str(tmp_path / "crafted"), str(marker))
    out = tmp_path / "model.pt"
    env = {k: v for k, v in os.environ.items() if k != "RAYEMB_DEBUG"}
    p = subprocess.run([sys.executable, "-m", "rayemb", "checkpoint", "export", "--checkpoint", crafted,
                        "--out", str(out)], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 2, p.stderr[-3000:]
    assert "Traceback" not in p.stderr
    errors = [line for line in p.stderr.splitlines() if line.startswith("rayemb: error:")]
    assert len(errors) == 1, p.stderr[-3000:]
    assert os.path.join(crafted, ".metadata") in errors[0] and "trusted input" in errors[0]
    assert not marker.exists() and not out.exists()
