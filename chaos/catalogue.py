"""The catalogue: hand-picked hostile values, each where it can do harm.

`catalogue(full)` puts every hand-picked number (10,000 digits, '²', '1e10000000',
NaN, ...) at every place a number goes, every wrong JSON type in every demo field,
every multipart and head defect, huge declared shapes and compression bombs; or,
not `full`, each value and each place at least once: what a random draw of a few
dozen cases would likely miss.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Callable

from chaos.blocks import (
    BAD_HEADS,
    BAD_NUMBER_TEXTS,
    DEMO_FIELDS,
    HEADER_UNSAFE,
    JOB_SITE,
    MAX_PARTS,
    MULTIPART_KINDS,
    Case,
    Targets,
    demo_body,
    demo_post,
    header_number_sites,
    http_request,
    multipart_case,
    number_sites,
    raw_request,
    shorten,
)

WRONG_JSON_TYPES = {
    "list": "[1]",
    "object": '{"a": 1}',
    "null": "null",
    "boolean": "true",
    "number": "1",
    "string": '"x"',
    "nested lists": "[" * 200 + "]" * 200,
    "60 kB string": '"' + "x" * 60_000 + '"',
}
HUGE_SHAPES = (
    (16, 10**9, 1, 1),
    (1, 16, 2**20, 2**20, 2**20),
    (16, 1, 16_384, 16_384),
    (16, 1, 4_096, 4_096),
    (16, 2**62, 2, 2),
)


def catalogue(full: bool) -> list[Case]:
    """Every hand-picked value at every place it can go (`full`), or each value and
    each place at least once: what a random draw of a few dozen would likely miss."""
    cases = _pairs(BAD_NUMBER_TEXTS, _all_number_sites, "bad number", full)
    cases += _pairs(tuple(WRONG_JSON_TYPES), _json_field_sites, "wrong JSON", full)
    for kind in MULTIPART_KINDS:
        cases.append(multipart_case(kind, "/v1/videos", MAX_PARTS, 2_000_000, 5000))
    for name, data in BAD_HEADS.items():
        cases.append(Case("bad head", name, "as sent", raw_request(data)))
    for encoding in ("gzip", "deflate"):
        cases.append(_bomb_case(encoding))
    for shape in HUGE_SHAPES:
        cases += _huge_shape_cases(shape)
    return cases


def _all_number_sites(value: str) -> dict[str, Callable[[Targets], bytes]]:
    sites = number_sites(value)
    if not HEADER_UNSAFE.search(value):
        sites.update(header_number_sites(value))
    return sites


def _json_field_sites(type_name: str) -> dict[str, Callable[[Targets], bytes]]:
    literal = WRONG_JSON_TYPES[type_name]
    return {
        f"POST /v1/videos JSON {name}": demo_post(demo_body(name, literal)) for name in DEMO_FIELDS
    }


def _pairs(
    values: tuple[str, ...],
    sites_for: Callable[[str], dict[str, Callable[[Targets], bytes]]],
    family: str,
    full: bool,
) -> list[Case]:
    """Cases of `values` at their sites: all pairs, or a rotation that covers each
    value and each site (the sites a value can go to are those `sites_for` gives)."""
    every = {value: sites_for(value) for value in values}
    if full:
        pairs = [(value, site) for value, sites in every.items() for site in sorted(sites)]
    else:
        names = sorted({site for sites in every.values() for site in sites})
        pairs = []
        for index in range(max(len(values), len(names))):
            value = values[index % len(values)]
            site = names[index % len(names)]
            pairs.append((value, site if site in every[value] else sorted(every[value])[0]))
    return [
        Case(family, site, shorten(value), every[value][site], JOB_SITE.search(site) is not None)
        for value, site in pairs
    ]


BOMB_BYTES = 256 * 1024 * 1024


def _bomb_case(encoding: str) -> Case:
    """A body that inflates to 256 MiB of zeros (a few hundred kB on the wire)."""

    def body() -> bytes:
        packer = zlib.compressobj(9, zlib.DEFLATED, 31 if encoding == "gzip" else 15)
        block = bytes(1 << 20)
        packed = [packer.compress(block) for _ in range(BOMB_BYTES >> 20)]
        return b"".join(packed) + packer.flush()

    headers = [("Content-Encoding", encoding)]
    site = f"POST /v1/videos/stream Content-Encoding: {encoding}"
    value = f"inflates to {BOMB_BYTES >> 20} MiB"
    return Case("bad head", site, value, http_request("POST", "/v1/videos/stream", headers, body))


def _huge_shape_cases(shape: tuple[int, ...]) -> list[Case]:
    """A latent file declaring `shape` with a few bytes of data, in both formats."""
    raw = bytes(64)
    header = {"latents": {"dtype": "F32", "shape": list(shape), "data_offsets": [0, len(raw)]}}
    text = json.dumps(header, separators=(",", ":")).encode()
    st_file = struct.pack("<Q", len(text)) + text + raw
    npy_header = f"{{'descr': '<f4', 'fortran_order': False, 'shape': {shape}, }}"
    padded = npy_header.ljust(-(-(len(npy_header) + 11) // 64) * 64 - 11) + "\n"
    npy_file = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(padded)) + padded.encode() + raw
    return [
        Case("corrupt file", f"POST /v1/videos {fmt}: huge declared shape", str(shape), builder)
        for fmt, builder in (
            ("safetensors", http_request("POST", "/v1/videos", body=st_file)),
            ("npy", http_request("POST", "/v1/videos/stream", body=npy_file)),
        )
    ]
