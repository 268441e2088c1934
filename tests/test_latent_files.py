"""Reading uploaded latent files: every valid file loads, every hostile one gets a typed 4xx."""

from __future__ import annotations

import gc
import json
import pickle
import struct
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import deserialize
from safetensors.torch import load as safetensors_load

from tests.helpers import safetensors_bytes
from tests.helpers.files import npy_bytes, npy_with_header, padded_safetensors, torch_save_bytes
from vaecast.errors import (
    InvalidRequestError,
    PayloadTooLargeError,
    VaecastError,
)
from vaecast.latent_files import check_audio, load_latents

SAFE_HINT = "save it with safetensors: safetensors.torch.save_file({'latents': z}, 'z.safetensors')"
PICKLE_REFUSED = f"pickle and torch.save files are refused (loading them can run code); {SAFE_HINT}"
NOT_A_TENSOR_FILE = f"the upload is not a safetensors or .npy file; {SAFE_HINT}"
SMALL = torch.arange(16 * 2 * 3 * 4, dtype=torch.float32).reshape(16, 2, 3, 4) / 100 - 0.5


def refusal(data: bytes, **kwargs: object) -> VaecastError:
    with pytest.raises(VaecastError) as raised:
        load_latents(data, **kwargs)  # type: ignore[arg-type]
    return raised.value


# --- every valid safetensors header length loads -------------------------------------------


def test_every_header_length_from_8_to_2048_is_read_as_safetensors():
    latents = SMALL[:, :1, :1, :1] * 3  # 16 values: a short header fits
    shortest = len(
        json.dumps(
            {"__metadata__": {"fps": "16"}, "latents": entry("F32", [16, 1, 1, 1], 64)},
            separators=(",", ":"),
        )
    )
    lead_bytes = set()
    for length in range(8, 2049):
        if length < shortest:
            # No room for a latents entry: an empty header, still read as safetensors.
            data = padded_safetensors(length, {})
            error = refusal(data)
            assert isinstance(error, InvalidRequestError), length
            assert error.message == (
                "the safetensors file has no tensor named 'latents' (found: none)"
            ), length
            continue
        data = padded_safetensors(length, {"latents": latents}, metadata={"fps": "16"})
        lead_bytes.add(data[:2])
        loaded = load_latents(data)
        assert torch.equal(loaded.latents, latents.unsqueeze(0)), length
        assert loaded.metadata["fps"] == "16", length
        # From a bytearray: a view where the offset is aligned, a copy where it is not.
        assert torch.equal(load_latents(bytearray(data)).latents, loaded.latents), length
    # The lengths whose first bytes read as a pickle's PROTO opcode were among them.
    assert {b"\x80\x00", b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05"} <= lead_bytes


def test_a_header_that_starts_like_a_pickle_loads_with_audio():
    audio = torch.linspace(-1, 1, 100).reshape(2, 50)
    data = padded_safetensors(
        0x280, {"latents": SMALL, "audio": audio}, metadata={"audio_sample_rate": "16000"}
    )
    assert data[:2] == b"\x80\x02"  # what a protocol-2 pickle starts with
    loaded = load_latents(data)
    assert torch.equal(loaded.latents, SMALL.unsqueeze(0))
    assert loaded.audio is not None and torch.equal(loaded.audio, audio)
    waveform, rate = check_audio(loaded.audio, loaded.metadata["audio_sample_rate"])
    assert rate == 16_000 and np.array_equal(waveform, audio.numpy())


@pytest.mark.parametrize(
    "dtype", [torch.float16, torch.bfloat16, torch.float64, torch.float8_e4m3fn, torch.float8_e5m2]
)
def test_every_float_dtype_loads_as_float32(dtype: torch.dtype):
    latents = SMALL.to(dtype)
    loaded = load_latents(safetensors_bytes(latents=latents)).latents
    assert loaded.dtype == torch.float32
    assert torch.equal(loaded, latents.to(torch.float32).unsqueeze(0))


def test_extra_tensors_of_dtypes_torch_lacks_do_not_stop_the_latents():
    base = safetensors_bytes(latents=SMALL)
    (size,) = struct.unpack_from("<Q", base)
    header = json.loads(base[8 : 8 + size])
    data = base[8 + size :]
    header["scales"] = {
        "dtype": "F8_E8M0",
        "shape": [4],
        "data_offsets": [len(data), len(data) + 4],
    }
    text = json.dumps(header).encode()
    loaded = load_latents(struct.pack("<Q", len(text)) + text + data + b"\x7f" * 4)
    assert torch.equal(loaded.latents, SMALL.unsqueeze(0))


# --- a bytearray upload is held once: the latents are a view of it ------------------------


def address_of(buffer: bytearray) -> int:
    return torch.frombuffer(buffer, dtype=torch.uint8, count=1).data_ptr()


def inside(tensor: torch.Tensor, buffer: bytearray) -> bool:
    start = address_of(buffer)
    return start <= tensor.data_ptr() < start + len(buffer)


@pytest.mark.parametrize("header_length", [0x280, 0x281, 0x282, 0x283])
def test_f32_latents_are_a_view_of_the_bytearray_when_aligned_else_a_copy(header_length: int):
    data = padded_safetensors(header_length, {"latents": SMALL, "audio": torch.ones(2, 8)})
    buffer = bytearray(data)
    loaded = load_latents(buffer)
    expected = safetensors_load(data)["latents"].unsqueeze(0)
    assert loaded.latents.view(torch.int32).equal(expected.view(torch.int32))  # byte-identical
    aligned = (address_of(buffer) + 8 + header_length) % 4 == 0
    assert inside(loaded.latents, buffer) == aligned
    assert loaded.audio is not None and not inside(loaded.audio, buffer)
    # The view keeps the buffer alive (and unresizable) after the caller drops it.
    del buffer
    gc.collect()
    assert loaded.latents.view(torch.int32).equal(expected.view(torch.int32))


def test_latents_from_bytes_are_a_copy_and_torch_does_not_warn():
    data = safetensors_bytes(latents=SMALL)
    loaded = load_latents(data).latents  # filterwarnings=error: a read-only view would warn
    loaded += 1  # writable, and writing it cannot touch the immutable bytes
    assert torch.equal(load_latents(data).latents + 1, loaded)


def test_f16_latents_convert_to_float32_exactly_as_safetensors_reads_them():
    latents = (torch.randn(16, 3, 5, 7) * 100).to(torch.float16)
    data = safetensors_bytes(latents=latents)
    loaded = load_latents(bytearray(data)).latents
    assert torch.equal(loaded, safetensors_load(data)["latents"].float().unsqueeze(0))


def test_native_npy_is_a_view_of_the_bytearray():
    buffer = bytearray(npy_bytes(SMALL.numpy()))
    loaded = load_latents(buffer).latents
    assert inside(loaded, buffer) and torch.equal(loaded, SMALL.unsqueeze(0))


PEAK_SCRIPT = """
import resource, sys, torch
from vaecast.latent_files import load_latents
kind, frames = sys.argv[1], int(sys.argv[2])
latents = torch.full((16, frames, 64, 64), 0.25)
if kind == "safetensors":
    from safetensors.torch import save
    body = bytearray(save({"latents": latents}))
else:
    import io, numpy as np
    out = io.BytesIO(); np.save(out, latents.numpy()); body = bytearray(out.getbuffer())
del latents
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
loaded = load_latents(body).latents
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
assert float(loaded[0, 0, 0, 0, 0]) == 0.25 and loaded.shape[2] == frames
print((after - before) * 1024 / len(body))
"""


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["safetensors", "npy"])
def test_loading_a_large_bytearray_upload_adds_almost_nothing_to_the_peak(kind: str):
    """In a fresh process, the high-water mark of RSS over the load: a copy of the
    128 MiB body (what safetensors.deserialize made) or a whole-tensor boolean
    temporary (the NaN scan's, 32 MiB) would show as 0.25 or more."""
    frames = 512  # 16 x 512 x 64 x 64 float32: 128 MiB
    result = subprocess.run(
        [sys.executable, "-c", PEAK_SCRIPT, kind, str(frames)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    growth = float(result.stdout.strip())
    assert growth < 0.15, growth


# --- .npy --------------------------------------------------------------------------------


@pytest.mark.parametrize("order", ["C", "F"])
@pytest.mark.parametrize("dtype", ["<f2", ">f2", "<f4", ">f4", "<f8", ">f8", "<g", ">g"])
def test_npy_of_any_float_dtype_byte_order_and_memory_order_loads(dtype: str, order: str):
    array = np.asarray(SMALL.numpy(), dtype=dtype, order=order)
    data = npy_bytes(array)
    if order == "F":
        assert b"'fortran_order': True" in data
    loaded = load_latents(data).latents
    assert loaded.dtype == torch.float32
    assert np.array_equal(loaded[0].numpy(), array.astype(np.float32))


def test_npy_version_2_and_3_headers_load():
    array = SMALL.numpy()
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (16, 2, 3, 4), }\n"
    for version in (2, 3):
        loaded = load_latents(npy_with_header(header, array.tobytes(), version)).latents
        assert np.array_equal(loaded[0].numpy(), array)


NPY_HEADER = "{'descr': '<f4', 'fortran_order': False, 'shape': (16, 2, 3, 4), }\n"
NPY_DATA = SMALL.numpy().tobytes()

NPY_REFUSED = [
    # (id, data, status, message)
    ("magic-only", b"\x93NUMPY\x01\x00", 415, "the .npy file is corrupt: its header is truncated"),
    (
        "header-cut",
        npy_bytes(SMALL.numpy())[:40],
        415,
        "the .npy file is corrupt: its header is truncated",
    ),
    (
        "header-unterminated",
        npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (16, 2, ", b""),
        415,
        "the .npy file is corrupt: its header cannot be parsed: the header ends early",
    ),
    (
        "shape-overflow",
        npy_with_header(
            NPY_HEADER.replace("(16, 2, 3, 4)", "(16, 1000000000000000, 1, 1)"), NPY_DATA
        ),
        415,
        "the .npy file is corrupt: its header declares shape (16, 1000000000000000, 1, 1) "
        "of <f4, more than 1536 bytes of data, but the file holds 1536",
    ),
    (
        "shape-past-int64",
        npy_with_header(
            NPY_HEADER.replace("(16, 2, 3, 4)", "(16, 99999999999999999999, 1, 1)"), NPY_DATA
        ),
        415,
        "the .npy file is corrupt: its header cannot be parsed: "
        "integer 99999999999999999999 is too large",
    ),
    (
        "data-cut",
        npy_with_header(NPY_HEADER, NPY_DATA[:-1]),
        415,
        "the .npy file is corrupt: its header declares shape (16, 2, 3, 4) of <f4, "
        "more than 1535 bytes of data, but the file holds 1535",
    ),
    (
        "data-extra",
        npy_with_header(NPY_HEADER, NPY_DATA + b"\0"),
        415,
        "the .npy file is corrupt: its header declares shape (16, 2, 3, 4) of <f4, "
        "1536 bytes of data, but the file holds 1537",
    ),
    (
        "header-too-long",
        npy_with_header(NPY_HEADER + " " * 10_000, NPY_DATA, version=2),
        415,
        "the .npy file is corrupt: its header is 10067 bytes, over the 10000 that numpy reads",
    ),
    (
        "python-not-a-literal",
        npy_with_header("not " * 2000 + "1\n", b""),
        415,
        "the .npy file is corrupt: its header cannot be parsed: unexpected 'not not no'",
    ),
    (
        "nested-deep",
        npy_with_header("(" * 1000 + ")" * 1000, b""),
        415,
        "the .npy file is corrupt: its header cannot be parsed: nested too deeply",
    ),
    (
        "version-9",
        b"\x93NUMPY\x09\x00" + b"\0" * 20,
        415,
        "the .npy file is corrupt: format version 9.0 is not one of 1.0, 2.0, 3.0",
    ),
    (
        "object",
        npy_bytes(np.array([{"a": 1}], dtype=object), allow_pickle=True),
        415,
        f"the .npy file cannot be read safely: it holds Python objects, which need pickle; "
        f"{SAFE_HINT}",
    ),
    (
        "structured",
        npy_bytes(np.zeros(3, dtype=[("a", "<f4"), ("b", "<f4")])),
        415,
        f"the .npy file cannot be read safely: structured arrays are not read; {SAFE_HINT}",
    ),
    (
        "strings",
        npy_bytes(np.array(["a", "b"])),
        415,
        f"the .npy file cannot be read safely: dtype '<U1' is not read; {SAFE_HINT}",
    ),
    (
        "integers",
        npy_bytes(np.zeros((16, 2, 3, 4), dtype=">i4")),
        422,
        "latents must be floating point, got int32",
    ),
    (
        "wrong-rank",
        npy_bytes(np.zeros((16, 2, 3), dtype="<f4")),
        422,
        "latents must be CTHW or BCTHW, got 3 dimensions (16, 2, 3)",
    ),
    (
        "zero-frames",
        npy_bytes(np.zeros((16, 0, 3, 4), dtype="<f4")),
        422,
        "latents have zero frames",
    ),
    (
        "nan",
        npy_bytes(np.full((16, 2, 3, 4), np.nan, dtype=">f8")),
        422,
        "latents contain NaN or infinite values",
    ),
    (
        "long-double-past-float32",
        npy_bytes(np.full((16, 1, 1, 1), 1e300, dtype="<g")),
        422,
        "latents contain NaN or infinite values",
    ),
]


@pytest.mark.parametrize(
    ("data", "status", "message"),
    [case[1:] for case in NPY_REFUSED],
    ids=[case[0] for case in NPY_REFUSED],
)
def test_bad_npy_files_are_refused_with_their_reason(data: bytes, status: int, message: str):
    error = refusal(data)
    assert (error.status, error.message) == (status, message)


# --- pickles and torch.save --------------------------------------------------------------


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_pickles_are_refused(protocol: int):
    error = refusal(pickle.dumps({"latents": SMALL.numpy()}, protocol=protocol))
    assert (error.status, error.message) == (415, PICKLE_REFUSED)


@pytest.mark.parametrize("protocol", [0, 1])
def test_old_pickles_are_not_tensor_files(protocol: int):
    error = refusal(pickle.dumps({"latents": [1.0]}, protocol=protocol))
    assert (error.status, error.message) == (415, NOT_A_TENSOR_FILE)


@pytest.mark.parametrize("zip_format", [True, False])
def test_torch_save_files_are_refused(zip_format: bool):
    error = refusal(torch_save_bytes({"latents": SMALL}, zip_format))
    assert (error.status, error.message) == (415, PICKLE_REFUSED)


# --- safetensors refusals ----------------------------------------------------------------


def header_and_data(header: object, data: bytes = b"") -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def entry(dtype: str, shape: list[int], end: int, begin: int = 0) -> dict[str, object]:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


ST_REFUSED = [
    (
        "truncated",
        safetensors_bytes(latents=SMALL)[:-10],
        415,
        "the safetensors file is corrupt: 'latents' spans bytes 0 to 1536 of a data section "
        "of 1526 bytes (is the file truncated?)",
    ),
    (
        "shape-overflow",
        header_and_data({"latents": entry("F32", [16, 2**40, 2**20, 1], 64)}, b"\0" * 64),
        415,
        "the safetensors file is corrupt: 'latents' of shape (16, 1099511627776, 1048576, 1) "
        "and dtype F32 needs more than 64 bytes but spans 64",
    ),
    (
        "shape-past-int64",
        header_and_data({"latents": entry("F32", [16, 2**64, 1, 1], 64)}, b"\0" * 64),
        415,
        "the safetensors file is corrupt: the header entry for 'latents' needs a dtype, "
        "a shape of sizes and two data_offsets",
    ),
    (
        "negative-size",
        header_and_data({"latents": entry("F32", [16, -1, 1, 1], 64)}, b"\0" * 64),
        415,
        "the safetensors file is corrupt: the header entry for 'latents' needs a dtype, "
        "a shape of sizes and two data_offsets",
    ),
    (
        "not-an-object",
        header_and_data({"latents": [1, 2]}, b""),
        415,
        "the safetensors file is corrupt: the header entry for 'latents' is not an object",
    ),
    (
        "bytes-past-the-tensors",  # the latents entry is fine; the whole file is not
        header_and_data({"latents": entry("F32", [16, 1, 1, 1], 64)}, b"\0" * 72),
        415,
        "the safetensors file is corrupt: its tensors cover 64 bytes of a data section of 72",
    ),
    (
        "hole-between-tensors",
        header_and_data(
            {"latents": entry("F32", [16, 1, 1, 1], 64), "x": entry("U8", [4], 72, 68)},
            b"\0" * 72,
        ),
        415,
        "the safetensors file is corrupt: tensor 'x' at bytes 68 to 72 leaves a hole before it",
    ),
    (
        "overlapping-tensors",
        header_and_data(
            {"latents": entry("F32", [16, 1, 1, 1], 64), "x": entry("U8", [8], 68, 60)},
            b"\0" * 68,
        ),
        415,
        "the safetensors file is corrupt: tensor 'x' at bytes 60 to 68 overlaps the tensor "
        "before it",
    ),
    (
        "latents-not-at-zero",
        header_and_data({"latents": entry("F32", [16, 1, 1, 1], 68, 4)}, b"\0" * 68),
        415,
        "the safetensors file is corrupt: tensor 'latents' at bytes 4 to 68 leaves a hole "
        "before it",
    ),
    (
        "other-tensor-of-unknown-dtype",
        header_and_data(
            {"latents": entry("F32", [16, 1, 1, 1], 64), "x": entry("F128", [1], 80, 64)},
            b"\0" * 80,
        ),
        415,
        "the safetensors file is corrupt: tensor 'x' has dtype 'F128', which safetensors "
        "does not have",
    ),
    (
        "other-tensor-of-wrong-size",
        header_and_data(
            {"latents": entry("F32", [16, 1, 1, 1], 64), "x": entry("F16", [2**62, 8], 80, 64)},
            b"\0" * 80,
        ),
        415,
        "the safetensors file is corrupt: tensor 'x' of shape (4611686018427387904, 8) and "
        "dtype F16 does not fill the 16 bytes it spans",
    ),
    (
        "sub-byte-tensor-ending-mid-byte",
        header_and_data(
            {"latents": entry("F32", [16, 1, 1, 1], 64), "x": entry("F4", [3], 66, 64)},
            b"\0" * 66,
        ),
        415,
        "the safetensors file is corrupt: tensor 'x' of shape (3,) and dtype F4 does not "
        "fill the 2 bytes it spans",
    ),
    (
        "other-tensor-with-decreasing-offsets",
        header_and_data(
            {"latents": entry("F32", [16, 1, 1, 1], 64), "x": entry("U8", [0], 64, 80)},
            b"\0" * 80,
        ),
        415,
        "the safetensors file is corrupt: the header entry for 'x' needs a shape of sizes "
        "and two increasing data_offsets",
    ),
    (
        "metadata-not-strings",
        header_and_data(
            {"__metadata__": {"fps": 16}, "latents": entry("F32", [16, 1, 1, 1], 64)},
            b"\0" * 64,
        ),
        415,
        "the safetensors file is corrupt: its __metadata__ is not an object of strings",
    ),
    (
        "too-many-values",
        header_and_data({"__metadata__": {}, "x": [[]] * 1_000_001}),
        415,
        "the safetensors file is corrupt: its header holds more than 1000000 JSON values",
    ),
    (
        "json-nested-deep",  # not a JSON object we can read: not safetensors at all
        struct.pack("<Q", 200_006) + b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        415,
        NOT_A_TENSOR_FILE,
    ),
    (
        "header-past-the-data",
        struct.pack("<Q", 1000) + b'{"latents": {}}',
        415,
        NOT_A_TENSOR_FILE,
    ),
    (
        "integers",
        safetensors_bytes(latents=SMALL.to(torch.int64)),
        422,
        "latents must be floating point, got int64",
    ),
    (
        "fp4",
        header_and_data({"latents": entry("F4", [16, 2, 2, 2], 64)}, b"\0" * 64),
        422,
        "latents dtype 'F4' is not supported; send F32, F16, BF16, F64, F8_E4M3 or F8_E5M2",
    ),
    (
        "batch-of-two",
        safetensors_bytes(latents=torch.zeros(2, 16, 1, 1, 1)),
        422,
        "latents must hold one video (batch 1), got batch 2",
    ),
    (
        "empty",
        safetensors_bytes(latents=torch.zeros(16, 1, 0, 4)),
        422,
        "latents are empty: shape (1, 16, 1, 0, 4)",
    ),
    (
        "long-names",
        safetensors_bytes(**{f"t{i:02}" + "x" * 50: torch.zeros(1) for i in range(12)}),
        422,
        "the safetensors file has no tensor named 'latents' (found: "
        + ", ".join(f"t{i:02}" + "x" * 37 + "..." for i in range(10))
        + ", ... 12 in all)",
    ),
    ("empty-upload", b"", 422, f"the upload is empty; {SAFE_HINT}"),
]


@pytest.mark.parametrize(
    ("data", "status", "message"),
    [case[1:] for case in ST_REFUSED],
    ids=[case[0] for case in ST_REFUSED],
)
def test_bad_safetensors_files_are_refused_with_their_reason(
    data: bytes, status: int, message: str
):
    error = refusal(data)
    assert (error.status, error.message) == (status, message)


# --- the caller's shape check runs on the declared shape, before any conversion --------------


class TooBig(PayloadTooLargeError):
    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__(f"too big: {shape}")
        self.shape = shape


def refuse_every_shape(shape: tuple[int, ...]) -> None:
    raise TooBig(shape)


def peak_bytes_of(data: bytes, check_shape) -> tuple[int, BaseException | None]:
    tracemalloc.start()
    try:
        load_latents(data, check_shape)
        raised = None
    except VaecastError as error:
        raised = error
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak, raised


FOUR_MIB_F8 = torch.full((16, 1, 512, 512), 0.5).to(torch.float8_e4m3fn)


def test_the_shape_check_sees_bcthw_and_stops_an_f8_file_before_any_copy():
    data = safetensors_bytes(latents=FOUR_MIB_F8)
    peak, raised = peak_bytes_of(data, refuse_every_shape)
    assert isinstance(raised, TooBig) and raised.shape == (1, 16, 1, 512, 512)
    assert peak < 256 * 1024, peak
    # The same measurement sees the copy a loaded file makes: the bound above can fail.
    peak, raised = peak_bytes_of(data, lambda shape: None)
    assert raised is None
    assert peak >= FOUR_MIB_F8.numel(), peak


def test_the_shape_check_stops_an_npy_file_before_any_copy():
    array = np.full((1, 16, 1, 256, 256), 0.5, dtype=">f2")  # 2 MiB, byte-swapped to load
    data = npy_bytes(array)
    peak, raised = peak_bytes_of(data, refuse_every_shape)
    assert isinstance(raised, TooBig) and raised.shape == (1, 16, 1, 256, 256)
    assert peak < 256 * 1024, peak
    peak, raised = peak_bytes_of(data, lambda shape: None)
    assert raised is None
    assert peak >= array.nbytes, peak


def test_the_shape_check_runs_after_the_422_checks():
    seen: list[tuple[int, ...]] = []
    error = refusal(safetensors_bytes(latents=torch.zeros(2, 16, 1, 1, 1)), check_shape=seen.append)
    assert error.message == "latents must hold one video (batch 1), got batch 2"
    assert seen == []
    load_latents(npy_bytes(SMALL.numpy()), seen.append)
    assert seen == [(1, 16, 2, 3, 4)]


# --- audio sample rate -------------------------------------------------------------------

RATE_MESSAGE = "audio_sample_rate must be an integer from 16000 to 48000 Hz, got "


@pytest.mark.parametrize(
    ("rate", "shown"),
    [
        ("²", "'²'"),
        ("4" * 5000, "'" + "4" * 40 + "...'"),
        ("1234567", "'1234567'"),
        ("٤٨٠٠٠", "'٤٨٠٠٠'"),  # Arabic-Indic digits: int() reads them, we do not
        (" 48000", "' 48000'"),
        ("-16000", "'-16000'"),
    ],
)
def test_sample_rates_other_than_a_few_ascii_digits_are_422(rate: str, shown: str):
    with pytest.raises(InvalidRequestError) as raised:
        check_audio(torch.zeros(2, 10), rate)
    assert raised.value.message == RATE_MESSAGE + shown


def test_a_zero_padded_sample_rate_is_accepted():
    assert check_audio(torch.zeros(10), "048000")[1] == 48_000


# --- hostile bytes never escape as anything but a VaecastError --------------------------------


VALID_FILES = [
    safetensors_bytes(metadata={"fps": "8"}, latents=SMALL, audio=torch.zeros(2, 8)),
    padded_safetensors(0x280, {"latents": SMALL}),
    npy_bytes(SMALL.numpy()),
    npy_bytes(np.asfortranarray(SMALL.numpy().astype(">f2"))),
]


def load_or_refuse(data: bytes) -> None:
    for buffer in (data, bytearray(data)):  # a copy from bytes, a view of a bytearray
        try:
            loaded = load_latents(buffer)
        except VaecastError as error:
            assert error.status in (413, 415, 422), error
            continue
        assert loaded.latents.dtype == torch.float32 and loaded.latents.ndim == 5
        if data[:1] != b"\x93":  # safetensors: safetensors' own validation agrees it is one
            deserialize(data)


@st.composite
def mutated_files(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(VALID_FILES)))
    for _ in range(draw(st.integers(1, 4))):
        position = draw(st.integers(0, len(data) - 1))
        data[position] = draw(st.integers(0, 255))
    return bytes(data[: draw(st.integers(0, len(data)))])


NPY_HEADER_TEXT = st.text(
    alphabet=st.sampled_from(list("{}()[]:,'\" 0123456789<>|=fiOLTrueFalsNnotdescrhapw_\n")),
    max_size=120,
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(["latents", "dtype", "shape", "data_offsets", "x"]), inner
        )
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(
        st.binary(max_size=300),
        mutated_files(),
        st.builds(
            lambda text, data: npy_with_header(text, data), NPY_HEADER_TEXT, st.binary(max_size=64)
        ),
        st.builds(
            lambda text: npy_with_header(NPY_HEADER.replace("(16, 2, 3, 4)", text), NPY_DATA),
            NPY_HEADER_TEXT,
        ),
        st.builds(
            lambda header, data: header_and_data(header, data),
            st.dictionaries(
                st.sampled_from(["latents", "audio", "__metadata__", "x"]), JSON_VALUES
            ),
            st.binary(max_size=64),
        ),
    )
)
def test_arbitrary_bytes_load_or_raise_a_typed_error(data: bytes):
    load_or_refuse(data)


@pytest.mark.parametrize("frame", [0, 1, 299])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_value_in_any_slice_of_the_scan_is_refused(frame: int, bad: float):
    latents = torch.zeros(16, 300, 32, 32)  # 16 Ki values a frame: the scan takes 256 at a time
    latents[3, frame, 31, 7] = bad
    error = refusal(bytearray(safetensors_bytes(latents=latents)))
    assert error.message == "latents contain NaN or infinite values"
