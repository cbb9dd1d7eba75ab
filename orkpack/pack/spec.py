"""Constants of the .orkpack v1 format. docs/FORMAT.md is the spec; this mirrors it.

kernels/orkpack.h carries the same numbers for C readers; tests/test_pack.py
checks the two agree.
"""
from __future__ import annotations

import struct

MAGIC = b"ORKPACK\0"
VERSION_MAJOR = 1
VERSION_MINOR = 8  # what every pack without a flag is written as; 1.1: the raw encoding; 1.2: host copies of NPU slices; 1.3: the model record; 1.4: activation smoothing records (docs/FORMAT.md 7); 1.5: the nf4dq encoding; 1.6: rotation records (docs/FORMAT.md 11); 1.7: the int5dq, int6dq, int8dq encodings; 1.8: int5dq and int6dq host copies
VERSION_MINOR_ONLINE = VERSION_MINOR + 1  # 1.9: a pack whose preamble sets FLAG_ONLINE_R4 (only such a pack says 1.9)
VERSION_MINOR_MAX = VERSION_MINOR_ONLINE  # the newest minor this orkpack reads
FLAG_ONLINE_R4 = 1  # preamble flags bit 0: the runtime must rotate every ffn_down input online (docs/FORMAT.md 11)
KNOWN_FLAGS = FLAG_ONLINE_R4
PREAMBLE_SIZE = 128  # the fixed struct at offset 0
PREAMBLE_BLOCK = 4096  # bytes [PREAMBLE_SIZE, PREAMBLE_BLOCK) are zero
ALIGN = 4096  # every data part starts on a 4 KiB boundary (mmap / DMA map)
CHECKSUM = "xxh3_64"  # seed 0, as hexadecimal text in the header

# little-endian preamble:
#  magic 8s, major H, minor H, preamble_size I, file_size Q, data_offset Q,
#  data_size Q, header_offset Q, header_size Q, data_xxh3 Q, header_xxh3 Q,
#  alignment I, flags I, reserved 40s, preamble_xxh3 Q
PREAMBLE_FMT = "<8sHHIQQQQQQQII40sQ"
assert struct.calcsize(PREAMBLE_FMT) == PREAMBLE_SIZE
PREAMBLE_XXH3_OFFSET = 120

# Caps a reader enforces before it allocates anything.
MAX_HEADER_SIZE = 256 * 1024 * 1024  # safetensors caps its header at 100 MB; ours holds the tier map too
MAX_TENSORS = 1_000_000
MAX_DIMS = 4
MAX_NAME_BYTES = 4096

# encodings
ENC_F32, ENC_F16, ENC_BF16 = "f32", "f16", "bf16"
ENC_INT8 = "int8"
ENC_NF4 = "nf4"
ENC_NF4DQ = "nf4dq"  # 1.5: bitsandbytes' NF4 at blocksize 32, absmax double-quantized (docs/FORMAT.md 3)
ENC_INT5DQ, ENC_INT6DQ, ENC_INT8DQ = "int5dq", "int6dq", "int8dq"  # 1.7: b-bit integers in blocks of 32, the
# block step double-quantized as nf4dq's absmax (docs/FORMAT.md 3, intdq); host only
INTDQ_BITS = {ENC_INT5DQ: 5, ENC_INT6DQ: 6, ENC_INT8DQ: 8}
INTDQ_ENCODINGS = tuple(INTDQ_BITS)
ENC_RAW = "raw"  # non-float tensors (integers, bool, f64, c64): the source bytes verbatim, host only
FLOAT_ENCODINGS = (ENC_F32, ENC_F16, ENC_BF16)
ENCODINGS = FLOAT_ENCODINGS + (ENC_INT8, ENC_NF4, ENC_RAW, ENC_NF4DQ) + INTDQ_ENCODINGS
NF4_ENCODINGS = (ENC_NF4, ENC_NF4DQ)  # the 4-bit NormalFloat encodings (host slices and host copies)
QUANT_ENCODINGS = (ENC_INT8,) + NF4_ENCODINGS + INTDQ_ENCODINGS  # the quantized (weight) encodings

# element types of a raw slice (its "dtype" key) -> numpy dtype (little-endian); bool is one byte, 0 or 1
RAW_DTYPES = {
    "bool": "|b1",
    "u8": "u1", "u16": "<u2", "u32": "<u4", "u64": "<u8",
    "i8": "i1", "i16": "<i2", "i32": "<i4", "i64": "<i8",
    "f64": "<f8",
    "c64": "<c8",  # complex64: float32 real, float32 imaginary
}

# tiers (engines)
TIER_NPU = "npu"
TIER_HOST = "host"  # CPU or GPU: the same UMA memory, consumed natively by either
TIERS = (TIER_NPU, TIER_HOST)

# dual residency (1.2): an NPU slice may carry a "host_copy" record, a second copy of the same
# source slice in host memory that the CPU reads at decode (M = 1 never goes to the NPU)
HOST_COPY_ENCODINGS = (ENC_NF4, ENC_NF4DQ, ENC_INT5DQ, ENC_INT6DQ)  # 1.8: the host low level's intdq encodings

# layouts
LAYOUT_ROW_MAJOR = "row_major"
LAYOUT_NPU_INT8 = "npu_int8"  # RK3588 native int8 B layout (N/32, K/32, 32, 32) per K segment
NPU_TILE_N = 32
NPU_TILE_K = 32
NPU_K_SEGMENT = 8192  # K > 8192 is split into segments, each tiled on its own

# parts each encoding has, in file order
PARTS = {
    ENC_F32: ("data",),
    ENC_F16: ("data",),
    ENC_BF16: ("data",),
    ENC_INT8: ("q", "scale"),
    ENC_NF4: ("codes", "absmax"),
    ENC_RAW: ("data",),
    ENC_NF4DQ: ("codes", "absmax_q", "absmax_scale", "absmax_offset"),
    **{e: ("codes", "absmax_q", "absmax_scale", "absmax_offset") for e in INTDQ_ENCODINGS},
}

NF4_BLOCK = 64
# a build's NF4 format (--nf4-format, the tier map's board "nf4_format") -> the encoding of its host NF4 slices
NF4_FORMATS = {"dq32": ENC_NF4DQ, "b64": ENC_NF4}
NF4_DEFAULT_FORMAT = "dq32"  # with --nf4-mode opt
NF4_B64 = "b64"  # the nf4 encoding's: bitsandbytes' quantize_4bit bytes (--nf4-mode bnb), and tier maps before formats
NF4DQ_BLOCK = 32  # nf4dq: elements per absmax
NF4DQ_GROUP = 256  # nf4dq: absmaxes per float32 scale

# element type of each part (numpy dtype names, little-endian); bf16 is carried as its uint16 bits
PART_DTYPES = {
    (ENC_F32, "data"): "<f4",
    (ENC_F16, "data"): "<f2",
    (ENC_BF16, "data"): "<u2",
    (ENC_INT8, "q"): "i1",
    (ENC_INT8, "scale"): "<f4",
    (ENC_NF4, "codes"): "u1",
    (ENC_NF4, "absmax"): "<f4",
    (ENC_RAW, "data"): "u1",
    (ENC_NF4DQ, "codes"): "u1",
    (ENC_NF4DQ, "absmax_q"): "u1",
    (ENC_NF4DQ, "absmax_scale"): "<f4",
    (ENC_NF4DQ, "absmax_offset"): "<f4",
    **{(e, p): t for e in INTDQ_ENCODINGS
       for p, t in (("codes", "u1"), ("absmax_q", "u1"), ("absmax_scale", "<f4"), ("absmax_offset", "<f4"))},
    # the bytes; the element type is the slice's "dtype" (RAW_DTYPES)
}
