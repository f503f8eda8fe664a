"""Reading `.safetensors` files with NumPy alone (no torch), with clear errors on damaged files.

The format is an 8-byte little-endian header length `N`, `N` bytes of JSON mapping each tensor
name to `{"dtype", "shape", "data_offsets": [begin, end]}` (offsets relative to the end of the
header, plus an optional `"__metadata__"` entry), then the raw little-endian tensor bytes.
Reading it ourselves (instead of `safetensors.numpy.load_file`) gives bfloat16 support without
extra packages, memory-mapped tensors (nothing is copied until a tensor is used) and an error
that names the file and the tensor when a download was cut short.
"""

import json
import os

import numpy as np

# safetensors dtype codes -> NumPy dtypes (little-endian). BF16 is read as uint16 and widened.
_DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}
_MAX_HEADER_BYTES = 100 * 1024 * 1024


def bfloat16_to_float32(bits):
    """Widens raw bfloat16 bit patterns (uint16) to float32 values, exactly."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def read_safetensors_header(path):
    """Returns `(header, data_start, file_size)` of a safetensors file after validating it.

    Raises:
        ValueError: when the file is shorter than its header says (truncated), the header is
            not valid JSON, or a tensor's byte range does not fit its dtype, shape or the file.
    """
    path = os.fspath(path)
    file_size = os.path.getsize(path)
    if file_size < 8:
        raise ValueError(
            f"{path} is not a valid safetensors file: it has {file_size} bytes, fewer than the "
            "8-byte header length. The file is truncated or empty."
        )
    with open(path, "rb") as file:
        header_size = int.from_bytes(file.read(8), "little")
        if header_size > _MAX_HEADER_BYTES or 8 + header_size > file_size:
            raise ValueError(
                f"{path} is truncated or not a safetensors file: its header claims {header_size} "
                f"bytes but the file has only {file_size - 8} bytes after the length field."
            )
        raw_header = file.read(header_size)
    try:
        header = json.loads(raw_header.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(
            f"{path} is not a valid safetensors file: bad JSON header ({error})"
        ) from None
    if not isinstance(header, dict):
        raise ValueError(f"{path} is not a valid safetensors file: the header is not a JSON object")
    data_start = 8 + header_size
    data_size = file_size - data_start
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = _DTYPES[info["dtype"]]
            shape = tuple(int(d) for d in info["shape"])
            begin, end = (int(o) for o in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(
                f"{path}: tensor {name!r} has an unsupported or malformed entry {info!r}. "
                f"Supported dtypes: {sorted(_DTYPES)}"
            ) from None
        expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if end - begin != expected or begin < 0:
            raise ValueError(
                f"{path}: tensor {name!r} spans bytes [{begin}, {end}) but dtype {info['dtype']} "
                f"and shape {list(shape)} need {expected} bytes. The file is corrupt."
            )
        if end > data_size:
            raise ValueError(
                f"{path} is truncated: tensor {name!r} needs bytes up to {data_start + end} but "
                f"the file has {file_size} bytes. Download the file again."
            )
    return header, data_start, file_size


def read_safetensors(path, names=None):
    """Reads tensors of a `.safetensors` file into NumPy arrays, without torch.

    Arrays are read-only views of a memory map (float32, float16, integer and bool tensors),
    except bfloat16 tensors, which are widened to float32 copies since NumPy has no bfloat16.

    Args:
        path: str or path. The `.safetensors` file.
        names: optional iterable of tensor names to read. Defaults to all tensors.

    Returns:
        A dict of tensor name to `np.ndarray`.

    Raises:
        ValueError: for a truncated or corrupt file, or when a requested name is absent.

    Example:
    >>> backbone = kbert.models.BertBackbone(vocabulary_size=100, num_layers=1, num_heads=2,
    ...                                      hidden_dim=16, intermediate_dim=32)
    >>> path = kbert.checkpoints.export_to_huggingface(backbone, "bert")
    >>> tensors = read_safetensors(path / "model.safetensors")
    >>> tensors["embeddings.word_embeddings.weight"].shape
    (100, 16)
    """
    header, data_start, file_size = read_safetensors_header(path)
    available = [k for k in header if k != "__metadata__"]
    if names is None:
        names = available
    else:
        names = list(names)
        absent = sorted(set(names) - set(available))
        if absent:
            raise ValueError(f"{path} has no tensors named {absent}")
    if file_size == data_start:
        buffer = np.zeros((0,), np.uint8)
    else:
        buffer = np.memmap(os.fspath(path), dtype=np.uint8, mode="r")
    tensors = {}
    for name in names:
        info = header[name]
        begin, end = info["data_offsets"]
        dtype = _DTYPES[info["dtype"]]
        shape = tuple(info["shape"])
        raw = buffer[data_start + begin : data_start + end]
        array = (
            np.frombuffer(raw, dtype=dtype).reshape(shape)
            if end > begin
            else np.zeros(shape, dtype)
        )
        if info["dtype"] == "BF16":
            array = bfloat16_to_float32(array)
        tensors[name] = array
    return tensors


def safetensors_metadata(path):
    """The `__metadata__` dict of a safetensors file (empty when absent)."""
    header, _, _ = read_safetensors_header(path)
    return dict(header.get("__metadata__") or {})
