"""A DSpark drafter as llama-server serves it (``--spec-type draft-dspark``): which checkpoint a
name means, where its GGUF is cached and the flags that serve it.

Why a torch-free module of its own: ``specsim validate --engine llama-server`` checks its flags
and starts its servers without torch, but a draft-dspark server needs ``-md <draft.gguf>``; the
grid must know, before it starts anything, which drafter a name means, whether its block fits
the settings and where its GGUF lives. Making the GGUF (``export_deepspec``, then llama.cpp's
own converter: docs/llama-cpp-dspark.md) needs torch and lives beside the export
(:func:`specsim.record.dspark_export.cached_gguf`).
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

from specsim.errors import SpecsimError

# what the conversion needs besides llama.cpp's source tree (sentencepiece: its converter)
NEEDS = ("torch", "transformers", "safetensors", "sentencepiece")
DRAFTS = "drafts"  # <cache>/drafts/<drafter id>-<content hash>.gguf


def shipped_root() -> Path:
    """The drafters shipped inside the package (``specsim/data/drafters``)."""
    from importlib import resources

    return Path(str(resources.files("specsim") / "data" / "drafters"))


def drafter_dir(spec: str) -> Path:
    """The checkpoint folder ``spec`` names: a drafter name of ``--drafter`` (``dspark`` =
    ``dspark-v3``, ``dspark-v2``: the one shipped under that name's folder stem, else the one
    ``train-drafter`` left in the cache), a shipped drafter's id (its folder name, e.g.
    ``dspark-v3-b179c9523d0e``) or a checkpoint folder. Torch-free, so the grid can refuse a bad
    name before its first server starts; the target the drafter was trained for is checked
    when the target is loaded (:func:`check_target`)."""
    from specsim.record.build import DRAFTER_DIRS
    from specsim.record.models import cache_dir

    if spec in DRAFTER_DIRS:
        stem = DRAFTER_DIRS[spec]
        pattern = re.compile(rf"{re.escape(stem)}-[0-9a-f]{{12}}")
        for root in (shipped_root(), cache_dir() / "drafters"):
            found = sorted(
                p
                for p in root.glob(f"{stem}-*")
                if pattern.fullmatch(p.name) and (p / "config.json").is_file()
            )
            if len(found) == 1:
                return found[0]
            if len(found) > 1:
                raise SpecsimError(
                    f"drafter {spec!r} names {len(found)} checkpoints in {root} (one per "
                    f"target); give the folder or id instead, e.g. {found[0].name}"
                )
        raise SpecsimError(
            f"no trained {spec!r} drafter (shipped or in {cache_dir() / 'drafters'}); run "
            "'specsim train-drafter' first, or give a checkpoint folder"
        )
    shipped = shipped_root() / spec
    if "/" not in spec and (shipped / "config.json").is_file():
        return shipped
    folder = Path(spec).expanduser()
    if (folder / "config.json").is_file():
        return folder.resolve()
    raise SpecsimError(
        f"drafter {spec!r} is neither a drafter name (dspark-v3), a shipped drafter's id "
        "(dspark-v3-b179c9523d0e) nor a checkpoint folder with a config.json"
    )


def drafter_config(folder: Path) -> dict[str, Any]:
    """A checkpoint's config.json as written (torch-free)."""
    try:
        return json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise SpecsimError(f"{folder / 'config.json'} is unreadable: {exc}") from None


def block_size(folder: Path) -> int:
    """The drafter's trained block size: llama.cpp clamps ``--spec-draft-n-max`` to it."""
    return int(drafter_config(folder).get("block_size", 16))  # llama.cpp's own default: 16


def has_confidence_head(folder: Path) -> bool:
    """llama-server refuses ``--spec-draft-p-min`` > 0 on a draft without one."""
    return bool(drafter_config(folder).get("enable_confidence_head", True))


@functools.lru_cache(maxsize=32)
def gguf_path(folder: Path) -> Path:
    """Where the drafter's GGUF is cached: named by its id and a hash of its config and weights,
    so a retrained checkpoint of the same name gets a GGUF of its own."""
    from specsim.record.models import cache_dir, file_hash

    return cache_dir() / DRAFTS / f"{folder.name}-{file_hash(folder)[:12]}.gguf"


def draft_dspark_args(gguf: str | Path, n_max: int, p_min: float = 0.0) -> tuple[str, ...]:
    """The llama-server flags that serve ``gguf`` as a DSpark draft: blocks of ``n_max``
    (llama.cpp decodes ``[anchor, mask x (n_max - 1)]``: a block of n_max, not the trained block
    cut, common/speculative.cpp ``draft()``), cut before the first raw confidence < ``p_min``
    (0: the whole block)."""
    return (
        "-md",
        str(gguf),
        "--spec-type",
        "draft-dspark",
        "--spec-draft-n-max",
        str(int(n_max)),
        "--spec-draft-p-min",
        repr(float(p_min)).removesuffix(".0"),  # exact (repr), and "0" for no cut
    )


def check_requirements() -> None:
    """One line naming what a draft-dspark grid lacks (the packages its traces and GGUF need,
    llama.cpp's converter), before any server starts."""
    import importlib.util

    from specsim.serve.llama_server import llama_cpp_source

    missing = [m for m in NEEDS if importlib.util.find_spec(m) is None]
    if missing:
        raise SpecsimError(
            f"draft-dspark settings need {', '.join(missing)} (their traces run the torch "
            "drafter, their GGUF llama.cpp's converter): install torch (README: Installing "
            "torch), then 'specsim[record]'; or leave the dspark settings out of --specs"
        )
    llama_cpp_source()  # convert_hf_to_gguf.py, with the install hint when it is missing


def check_target(folder: Path, target_sha256: str) -> None:
    """Refuse a drafter trained for another target (its features would be another model's)."""
    want = drafter_config(folder).get("extra", {}).get("target_sha256")
    if want and want != target_sha256:
        raise SpecsimError(
            f"drafter {folder.name} was trained for target {want[:12]}, not for the served "
            f"target {target_sha256[:12]}; give a drafter of this target"
        )
