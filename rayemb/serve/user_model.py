"""The inference model of any model factory, and the factory's code carried inside the export.

A DLRM selected by ``model.name: dlrm`` (and every export whose model.json names
no ``name`` and no ``factory``: those made before other models could be exported)
is rebuilt by :func:`rayemb.serve.model.build_dlrm`. Any other model is built the
way the job built it, ``factory(embeddings, schema, **args)``, around plain
modules: the pooled tables as one ``EmbeddingBagCollection`` of the job's
``table_configs`` (a ``CompressedEmbeddingBagCollection`` when the checkpoint's
tables are compressed), the sequence tables as the job's ``EmbeddingCollection``.
:func:`rayemb.contract.model.check_model` says where the model holds them; the
checkpoint's logical tables map onto those paths
(:func:`rayemb.serve.model.inference_state`).

A factory from a module outside the installed packages (``examples/deepfm.py``
next to the job's config) is copied into the export, so the model loads where
that file is not::

    DIR/code/examples/deepfm.py     the module under its package path (a top-level package with an
                                    __init__.py: that whole package, without __pycache__)

model.json's ``code`` lists it; loading puts ``DIR/code`` first on ``sys.path``
before it imports the factory by its ``module:function`` name, so loading an
export runs the code it carries. That folder must lie inside the export, symlinks
resolved (:func:`code_dir`): a model.json naming any other cannot make a load run
code from elsewhere on the machine. A factory defined
in a script (module ``__main__``) has no file to copy: exporting it is an error
naming the fix.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import shutil
import sys
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Tuple

from rayemb.errors import BAD_FACTORY, ConfigError, DataError

if TYPE_CHECKING:
    from rayemb.config import ModelConfig

#: the category of the error about an export whose code folder is not its own
BAD_EXPORT_CODE = "bad_export_code"
#: the folder of an export that holds the factory's code
CODE_DIR = "code"
#: where the DLRM holds its embedding modules
DLRM_PATHS = {"pooled": "embedding", "sequence": "sequence"}


def is_dlrm(model_cfg: Mapping[str, Any]) -> bool:
    """Whether model.json's model section is the shipped DLRM by name (old exports name nothing: DLRM)."""
    return not model_cfg.get("factory") and str(model_cfg.get("name") or "dlrm") == "dlrm"


def model_name(model_cfg: Mapping[str, Any]) -> str:
    """How the job named its model: ``package.module:function`` or a shipped model's name."""
    return str(model_cfg.get("factory") or model_cfg.get("name") or "dlrm")


def check_exportable(factory: Optional[str]) -> None:
    """:class:`ConfigError` (``bad_model_factory``) when ``factory`` is a script's function (module ``__main__``):
    an export carries its factory's module file, and a script run as ``__main__`` cannot be imported again."""
    if factory and factory.partition(":")[0] == "__main__":
        raise ConfigError(f"The model factory {factory} was defined in the script that ran the job (module "
                          "__main__), so an export cannot carry its code. Define the factory in a module file (e.g. "
                          "my_models.py beside the script, `from my_models import build`) and export with --checkpoint "
                          "CHECKPOINT --config JOB.yaml whose model.factory names it ('my_models:build').", BAD_FACTORY)


def pooled_module(schema: Any, model_cfg: Mapping[str, Any], device: Any) -> Any:
    """One plain table per pooled table (a shared one read by all its features): an ``EmbeddingBagCollection``,
    or with ``model_cfg["compression"]`` (table -> storage, from the checkpoint's meta.json) a
    ``CompressedEmbeddingBagCollection`` stored alike."""
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    from rayemb.contract.tables import table_configs

    tables = table_configs(schema, int(model_cfg["embedding_dim"]))  # fp32: fp16-trained rows widen exactly
    if model_cfg.get("compression"):
        from rayemb.embedding.compressed import CompressedEmbeddingBagCollection
        from rayemb.embedding.compression_math import storage_spec

        # compressed tables as trained (physical tables T__q / T__r / T__block, ids split inside)
        specs = {t: storage_spec(st) for t, st in model_cfg["compression"].items()}
        return CompressedEmbeddingBagCollection(tables, specs, device=device)
    return EmbeddingBagCollection(tables=tables, device=device)


def job_model_config(model_cfg: Mapping[str, Any]) -> "ModelConfig":
    """The job's :class:`~rayemb.config.ModelConfig` again, from model.json's ``model`` section (its entries
    beside the config's, e.g. ``compression``, left out; exports made before ``sequence_tower`` have none)."""
    from rayemb.config import ModelConfig

    known = {f.name for f in dataclasses.fields(ModelConfig)}
    given = {k: tuple(v) if isinstance(v, list) else v for k, v in model_cfg.items() if k in known and k != "args"}
    return ModelConfig(**{**given, "args": dict(model_cfg.get("args") or {})})


def sequence_parts(schema: Any, model_cfg: Mapping[str, Any], device: Any) -> Tuple[Any, List[Any]]:
    """(the sequence ``EmbeddingCollection`` or None, its features) as the training job builds them."""
    from rayemb.contract.tables import sequence_features, sequence_module

    cfg = job_model_config(model_cfg)
    return sequence_module(cfg, schema, device=device), sequence_features(cfg, schema)


def build_factory_model(schema: Any, model_cfg: Mapping[str, Any], device: Any) -> Tuple[Any, Dict[str, str]]:
    """(the model its factory builds around plain embedding modules on ``device``, where it holds them)."""
    import torch

    from rayemb.contract.model import Embeddings
    from rayemb.contract.factory import model_spec_from_json

    device = torch.device(device or "cpu")
    dim = int(model_cfg["embedding_dim"])
    sequence, features = sequence_parts(schema, model_cfg, device)
    embeddings = Embeddings(pooled=pooled_module(schema, model_cfg, device), features=tuple(schema.pooled_features),
                            dim=dim, sequence=sequence, sequence_features=tuple(features), device=device,
                            dims=schema.feature_dims(dim))
    return model_spec_from_json(model_cfg).build(embeddings, schema)


def _module_root(module_name: str, path: str) -> str:
    """The directory that holds ``module_name``'s top-level package (the sys.path entry it was imported from)."""
    levels = len(module_name.split(".")) - 1 + (os.path.basename(path) == "__init__.py")
    root = os.path.dirname(os.path.abspath(path))
    for _ in range(levels):
        root = os.path.dirname(root)
    return root


def copy_factory_code(factory: str, directory: str) -> Optional[Dict[str, Any]]:
    """Copies the module of ``factory`` (``module:function``) into ``directory/code`` unless it is installed;
    returns model.json's ``code`` entry (None: nothing copied)."""
    from rayemb.contract.factory import _installed

    check_exportable(factory)
    module_name = factory.partition(":")[0]
    module = sys.modules.get(module_name) or importlib.import_module(module_name)
    path = getattr(module, "__file__", None)
    if not path:
        raise ConfigError(f"The model factory {factory} comes from a module without a file ({module!r}), so an "
                          "export cannot carry its code. Define the factory in a module file and name it "
                          "'module:function'.", BAD_FACTORY)
    if _installed(path):
        return None
    root, top = _module_root(module_name, path), module_name.split(".")[0]
    dest = os.path.join(directory, CODE_DIR)
    if os.path.isfile(os.path.join(root, top, "__init__.py")):  # a regular package: all of it
        shutil.copytree(os.path.join(root, top), os.path.join(dest, top),
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    else:  # a namespace package or a top-level module: the module file under its package path
        target = os.path.join(dest, os.path.relpath(os.path.abspath(path), root))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(path, target)
    files = sorted(os.path.relpath(os.path.join(d, n), dest) for d, _, names in os.walk(dest) for n in names)
    return {"dir": CODE_DIR, "module": module_name, "files": files}


def code_dir(directory: str, info: Mapping[str, Any]) -> Optional[str]:
    """The export's code folder when model.json lists one; :class:`DataError` (``bad_export_code``) unless it and
    everything in it lie inside the export.

    Loading imports from this folder, so an export whose model.json pointed elsewhere (``../x``, an absolute path,
    a symlink out) would run code the export does not carry: refused before anything is imported."""
    code = info.get("code")
    if not code:
        return None
    rel = code.get("dir", CODE_DIR) if isinstance(code, Mapping) else None
    parts = str(rel).replace("\\", "/").split("/") if isinstance(rel, str) else []
    root = os.path.realpath(directory)

    def refuse(why: str) -> DataError:
        return DataError(f"The export {directory!r} names in model.json's code.dir the folder {rel!r}, which {why}. "
                         "An export's code folder is a sub-folder of the export itself (code.dir: \"code\"), "
                         "because loading it imports and runs that code: re-export the model with `rayemb export`, "
                         "and load only exports from a source you trust.", category=BAD_EXPORT_CODE)

    if not isinstance(rel, str) or not rel.strip("/\\. "):
        raise refuse("is not a folder name")
    if os.path.isabs(rel) or rel.startswith(("/", "\\")) or os.path.splitdrive(rel)[0]:
        raise refuse("is an absolute path")
    if ".." in parts:
        raise refuse("climbs out of the export ('..')")
    folder = os.path.join(directory, rel)
    if not _inside(os.path.realpath(folder), root):
        raise refuse(f"resolves (through a symlink) to {os.path.realpath(folder)!r}, outside the export")
    if not os.path.isdir(folder):
        raise refuse("does not exist in the export")
    inner = os.path.realpath(folder)
    for d, dirs, names in os.walk(folder):  # symlinks are not followed: each is checked as an entry
        for n in dirs + names:
            if not _inside(os.path.realpath(os.path.join(d, n)), inner):
                raise refuse(f"holds {os.path.relpath(os.path.join(d, n), folder)!r}, a symlink to "
                             f"{os.path.realpath(os.path.join(d, n))!r} outside the folder")
    return folder


def _inside(path: str, root: str) -> bool:
    """Whether the resolved ``path`` is ``root`` or lies under it."""
    return os.path.commonpath([path, root]) == root


def put_on_path(folder: Optional[str]) -> None:
    """``folder`` first on ``sys.path`` (once), so that the factory's module imports from it."""
    if not folder:
        return
    folder = os.path.abspath(folder)
    if folder not in (os.path.abspath(p or ".") for p in sys.path):
        sys.path.insert(0, folder)
        importlib.invalidate_caches()


def read_code(folder: Optional[str]) -> Dict[str, bytes]:
    """The files under an export's code folder (relative path -> bytes), to send to another process."""
    if not folder:
        return {}
    out = {}
    for d, _, names in os.walk(folder):
        for n in names:
            with open(os.path.join(d, n), "rb") as f:
                out[os.path.relpath(os.path.join(d, n), folder)] = f.read()
    return out


def write_code(files: Mapping[str, bytes]) -> Optional[str]:
    """Writes :func:`read_code`'s files into a new temporary folder; returns it (None: no files)."""
    if not files:
        return None
    import tempfile

    folder = tempfile.mkdtemp(prefix="rayemb-code-")
    for rel, data in files.items():
        os.makedirs(os.path.dirname(os.path.join(folder, rel)), exist_ok=True)
        with open(os.path.join(folder, rel), "wb") as f:
            f.write(data)
    return folder


__all__ = ["BAD_EXPORT_CODE", "CODE_DIR", "DLRM_PATHS", "build_factory_model", "check_exportable", "code_dir", "copy_factory_code",
           "is_dlrm", "job_model_config", "model_name", "pooled_module", "put_on_path", "read_code", "sequence_parts", "write_code"]
