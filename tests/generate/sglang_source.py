"""SGLang 0.5.23's own request and response code, loaded on a CPU-only machine (the `sglang_schema` lane).

`make install` puts `sglang==0.5.23` in with `--no-deps` plus the `.[sglang_schema]` extra (msgspec; torch is
the SpecForge lane's CPU build, which sampling_params' watermarking import needs). What runs here is SGLang's
code, unchanged:

- `sglang.api.v1.api_types` (the generated JSON contract both SGLang servers decode /generate with, and the
  response structs `GenerateResponse`, `GenerateMetaInfo`, `GenerateStreamError`) and
  `sglang.srt.entrypoints.api_contract.generate_contract_error` (what `http_server.generate_request` runs
  first): imported as modules.
- `sglang.srt.sampling.sampling_params.SamplingParams` (`__init__`, `normalize`, `verify`): imported.
- `sglang.srt.managers.io_struct.GenerateReqInput` (`normalize_batch_and_arguments`) and `AbortReq` (with
  `BaseReq`, what POST /abort_request parses its body into): io_struct.py imports
  `schedule_batch`, which pulls every model config, torchvision and the CUDA kernels, so the class is
  compiled from io_struct.py's own source (its lines, its file name in tracebacks) into a namespace that
  holds io_struct's own imports; the four names it takes from modules that cannot load here
  (`get_return_hidden_states_mode` + `CaptureHiddenMode`, `has_valid_data` + `flatten_nested_list`) are
  compiled the same way from their own files. Nothing is rewritten or stubbed.

`import sglang` itself runs sglang/__init__.py, which imports sglang.srt.utils.common (triton,
torch.distributed, the platform layer): the packages `sglang`, `sglang.srt`, `sglang.srt.utils` are
therefore entered as bare packages (their __path__, not their __init__) while the modules above load, and
every `sglang*` entry is taken out of sys.modules again afterwards.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.metadata
import importlib.util
import sys
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SGLANG_VERSION = "0.5.23"
# Older releases' files (scripts/sglang_releases.py, run by `make install`): <dir>/<version>/srt/...
RELEASES_DIR = Path(sys.prefix) / "sglang-releases"
# Packages whose __init__ must not run on CPU (see the module docstring).
_BARE = ("sglang", "sglang.srt", "sglang.srt.utils")


@dataclass
class SGLangSource:
    """The loaded SGLang parts, plus where they came from."""

    version: str
    root: Path  # the installed sglang package folder
    api_types: types.ModuleType
    generate_contract_error: Any
    SamplingParams: Any
    GenerateReqInput: Any
    AbortReq: Any  # the body of POST /abort_request (FastAPI parses it with pydantic: Body())
    io_struct_namespace: dict[str, Any]

    def read(self, rel: str) -> str:
        return (self.root / rel).read_text(encoding="utf-8")


def unavailable_reason() -> str | None:
    """Why the SGLang lane cannot load (None when it can)."""
    try:
        version = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return f"sglang is not installed: `make install` adds sglang=={SGLANG_VERSION} --no-deps (the SGLang lane)"
    if version != SGLANG_VERSION:
        return f"sglang {version} is installed, this lane checks against {SGLANG_VERSION}"
    for mod, extra in (("msgspec", "sglang_schema"), ("torch", "specforge")):
        if importlib.util.find_spec(mod) is None:
            return f"{mod} is missing: `make install` installs it (the .[{extra}] extra)"
    return None


def _file_namespace(path: Path, tree: ast.Module) -> dict[str, Any]:
    """A namespace holding `path`'s own non-sglang top-level imports (one that cannot load here, e.g. triton
    in utils/common.py, is left out: a definition that used it would fail with a NameError, loudly)."""
    # a module object of its own (dataclasses look the class's module up in sys.modules), under a name
    # that is not sglang's: the real sglang.* stays unimported
    rel = path.with_suffix("").parts[-3:]
    mod = types.ModuleType("sglang_source_of." + ".".join(rel))
    mod.__file__ = str(path)
    sys.modules[mod.__name__] = mod
    ns = mod.__dict__
    for node in tree.body:
        if isinstance(node, ast.Import):
            if any(a.name.startswith("sglang") for a in node.names):
                continue
        elif isinstance(node, ast.ImportFrom):
            if (node.module or "").startswith("sglang") or node.module == "__future__":
                continue
        else:
            continue
        try:
            exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), ns)
        except ImportError:
            pass
    return ns


def _compile_defs(path: Path, names: set[str], provided: dict[str, Any] | None = None) -> dict[str, Any]:
    """The top-level definitions `names` of `path`, compiled from its own source (its line numbers) in a
    namespace of the file's own imports plus `provided` (the sglang names they use, loaded before)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    ns = _file_namespace(path, tree)
    ns.update(provided or {})
    picked: list[ast.stmt] = []
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name in names:
            picked.append(node)
            found.add(node.name)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id in names:
                picked.append(node)
                found.add(target.id)
    missing = names - found
    if missing:
        raise RuntimeError(f"{path}: no top-level definition of {sorted(missing)} (SGLang changed?)")
    future = ast.parse("from __future__ import annotations").body
    exec(compile(ast.Module(body=future + picked, type_ignores=[]), str(path), "exec"), ns)
    return ns


@functools.cache
def load() -> SGLangSource:
    """The SGLang parts (once per process); raises RuntimeError with unavailable_reason() when they cannot load."""
    reason = unavailable_reason()
    if reason is not None:
        raise RuntimeError(reason)
    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.submodule_search_locations
    root = Path(next(iter(spec.submodule_search_locations)))
    # whatever an earlier (failed) `import sglang` left in sys.modules is set aside, then put back
    before = {k: sys.modules.pop(k) for k in list(sys.modules) if k == "sglang" or k.startswith("sglang.")}
    try:
        for name in _BARE:
            mod = types.ModuleType(name)
            folder = root.joinpath(*name.split(".")[1:])
            mod.__path__ = [str(folder)]
            mod.__file__ = str(folder / "__init__.py")
            mod.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
            mod.__spec__.submodule_search_locations = [str(folder)]
            sys.modules[name] = mod
        api_types = importlib.import_module("sglang.api.v1.api_types")
        contract = importlib.import_module("sglang.srt.entrypoints.api_contract")
        sampling = importlib.import_module("sglang.srt.sampling.sampling_params")
        kv_hints = importlib.import_module("sglang.srt.managers.kv_hints")
        validators = importlib.import_module("sglang.srt.utils.field_validators")
        msgspec_utils = importlib.import_module("sglang.srt.utils.msgspec_utils")
        weight_versions = importlib.import_module("sglang.srt.utils.weight_versions")
    finally:
        for k in [k for k in sys.modules if k == "sglang" or k.startswith("sglang.")]:
            del sys.modules[k]
        sys.modules.update(before)

    srt = root / "srt"
    capture = _compile_defs(srt / "model_executor" / "forward_batch_info.py", {"CaptureHiddenMode"})
    sched = _compile_defs(
        srt / "managers" / "schedule_batch.py",
        {"ReturnHiddenStatesMode", "SamplingLogprobsMode", "get_return_hidden_states_mode"},
        {"CaptureHiddenMode": capture["CaptureHiddenMode"]},
    )
    flatten = _compile_defs(srt / "utils" / "common.py", {"flatten_nested_list"})
    mm = _compile_defs(
        srt / "multimodal" / "mm_utils.py", {"has_valid_data"}, {"flatten_nested_list": flatten["flatten_nested_list"]}
    )
    # GenerateReqInput's sglang names, each from where io_struct.py imports it.
    provided = {
        "SamplingParams": sampling.SamplingParams,
        "KvHintsEnvelope": kv_hints.KvHintsEnvelope,
        "decode_kv_hints_envelope": kv_hints.decode_kv_hints_envelope,
        "validate_optional_list_i64_1d_2d": validators.validate_optional_list_i64_1d_2d,
        "has_valid_data": mm["has_valid_data"],
        "msgspec_struct_pydantic_core_schema": msgspec_utils.msgspec_struct_pydantic_core_schema,
        "WeightVersionSpans": weight_versions.WeightVersionSpans,
        **{k: sched[k] for k in ("ReturnHiddenStatesMode", "SamplingLogprobsMode", "get_return_hidden_states_mode")},
    }
    ns = _compile_defs(
        srt / "managers" / "io_struct.py", {"GenerateReqInput", "BaseReq", "AbortReq", "FinishReasonDict"}, provided
    )
    return SGLangSource(
        version=importlib.metadata.version("sglang"),
        root=root,
        api_types=api_types,
        generate_contract_error=contract.generate_contract_error,
        SamplingParams=sampling.SamplingParams,
        GenerateReqInput=ns["GenerateReqInput"],
        AbortReq=ns["AbortReq"],
        io_struct_namespace=ns,
    )


def field_annotation(src: SGLangSource, name: str) -> Any:
    """The type of GenerateReqInput field `name` as FastAPI sees it (io_struct's annotation, evaluated there)."""
    raw = src.GenerateReqInput.__dataclass_fields__[name].type
    return eval(raw, {**vars(typing), **src.io_struct_namespace}) if isinstance(raw, str) else raw


def release_unavailable(version: str) -> str | None:
    """Why release `version`'s source cannot be read here (None when it can)."""
    if version == SGLANG_VERSION:
        return unavailable_reason()
    if not (RELEASES_DIR / version / "source.json").is_file():
        return (
            f"sglang {version}'s source is not under {RELEASES_DIR}: `make install` fetches it "
            "(scripts/sglang_releases.py)"
        )
    return None


def release_reader(version: str) -> Callable[[str], str]:
    """`read(rel_path)` over release `version`'s sglang package files (the installed one, or the files
    scripts/sglang_releases.py kept of an older release's wheel)."""
    if version == SGLANG_VERSION:
        return load().read
    root = RELEASES_DIR / version
    return lambda rel: (root / rel).read_text(encoding="utf-8")
