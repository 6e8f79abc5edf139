#!/usr/bin/env python3
"""Write the npy_input target's seeds into seeds/npy_input/ (no numpy
needed): three selector bytes (dtype index, rows - 1, cols - 1, as the
target reads them) then a small v1 .npy file of that dtype and shape."""
import os
import struct

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "npy_input")


def npy(descr, shape, data, fortran=False):
    dims = ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "")
    h = "{'descr': '%s', 'fortran_order': %s, 'shape': (%s), }" % (
        descr, "True" if fortran else "False", dims)
    h += " " * ((64 - (10 + len(h) + 1) % 64) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h.encode() + data


def value(fmt, v):
    return struct.pack("<" + fmt, float(v) if fmt in "fe" else v)


os.makedirs(HERE, exist_ok=True)
# The target's dtype order: f32, f16, bf16 (as <f4), i8, i32, u8.
for d, descr, fmt in [(0, "<f4", "f"), (1, "<f2", "e"), (2, "<f4", "f"),
                      (3, "|i1", "b"), (4, "<i4", "i"), (5, "|u1", "B")]:
    for r, c in [(2, 3), (1, 5), (4, 1)]:
        data = b"".join(value(fmt, i % 7) for i in range(r * c))
        with open(os.path.join(HERE, f"seed_{d}_{r}_{c}.bin"), "wb") as f:
            f.write(bytes([d, r - 1, c - 1]) + npy(descr, (r, c), data))
    with open(os.path.join(HERE, f"seed_{d}_1d.bin"), "wb") as f:
        f.write(bytes([d, 0, 5]) + npy(descr, (6,), b"".join(value(fmt, 1) for _ in range(6))))
with open(os.path.join(HERE, "seed_fortran.bin"), "wb") as f:
    f.write(bytes([0, 1, 2]) + npy("<f4", (2, 3), struct.pack("<6f", *range(6)), True))
with open(os.path.join(HERE, "seed_be.bin"), "wb") as f:
    f.write(bytes([0, 1, 2]) + npy(">f4", (2, 3), struct.pack(">6f", *range(6))))
