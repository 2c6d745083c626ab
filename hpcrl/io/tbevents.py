"""TensorBoard event files of scalars, written with the standard library only.

An event file is a sequence of TFRecords, each ``uint64 length, uint32 masked CRC-32C of the
length, data, uint32 masked CRC-32C of the data`` (little-endian), whose data is one
serialised ``tensorflow.Event`` protocol buffer. The first event carries ``file_version =
"brain.Event:2"``; each later one a ``Summary`` with one ``Value{tag, simple_value}``. Only the
handful of protobuf fields needed are encoded here, by hand:

    Event:   wall_time = 1 (double), step = 2 (int64), file_version = 3 (string), summary = 5
    Summary: value = 1 (repeated Value);  Value: tag = 1 (string), simple_value = 2 (float)

so exporting metrics needs neither TensorFlow nor torch (tensorboardX imports torch when it is
installed, seconds on a login node) nor protobuf.
"""

from __future__ import annotations

import math
import os
import socket
import struct
import time
from pathlib import Path

_CRC_TABLE: list[int] = []
FLOAT32_MAX = 3.4028234663852886e38


def _crc_table() -> list[int]:
    if not _CRC_TABLE:
        for n in range(256):
            c = n
            for _ in range(8):
                c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1   # Castagnoli, reflected
            _CRC_TABLE.append(c)
    return _CRC_TABLE


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), as TFRecord uses; crc32c(b"123456789") == 0xE3069283."""
    table, crc = _crc_table(), 0xFFFFFFFF
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1                    # int64 as protobuf encodes it (two's complement)
    out = bytearray()
    while True:
        bits, n = n & 0x7F, n >> 7
        out.append(bits | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, wire: int) -> bytes:
    return _varint(number << 3 | wire)


def _bytes_field(number: int, payload: bytes) -> bytes:
    return _field(number, 2) + _varint(len(payload)) + payload


def encode_event(wall_time: float, step: int = 0, *, file_version: str | None = None,
                 tag: str | None = None, value: float | None = None) -> bytes:
    """One serialised Event: a file-version event, or one scalar."""
    out = _field(1, 1) + struct.pack("<d", wall_time) + _field(2, 0) + _varint(int(step))
    if file_version is not None:
        out += _bytes_field(3, file_version.encode())
    if tag is not None:
        value = float(value)
        if abs(value) > FLOAT32_MAX and math.isfinite(value):
            value = math.copysign(math.inf, value)            # what a float32 holds
        val = _bytes_field(1, tag.encode()) + _field(2, 5) + struct.pack("<f", value)
        out += _bytes_field(5, _bytes_field(1, val))
    return out


def record(data: bytes) -> bytes:
    """One TFRecord around ``data``."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked_crc(length)) + data + struct.pack("<I",
                                                                              masked_crc(data))


#: Event files this module writes end so (TensorBoard reads any name containing "tfevents").
SUFFIX = ".hpcrl"


class EventFileWriter:
    """Writes scalars to a new ``DIR/events.out.tfevents.<unix time>.<host>.<pid>.hpcrl``.

    ``replace``: first delete the event files an earlier export wrote into ``DIR`` (those
    ending in ``.hpcrl``), so that exporting a run again does not show every point twice.
    """

    def __init__(self, directory: str | os.PathLike, replace: bool = True):
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        if replace:
            for old in directory.glob(f"events.out.tfevents.*{SUFFIX}"):
                old.unlink(missing_ok=True)
        now = time.time()
        self.path = directory / (f"events.out.tfevents.{int(now)}.{socket.gethostname()}."
                                 f"{os.getpid()}{SUFFIX}")
        self._fh = open(self.path, "xb")
        self._fh.write(record(encode_event(now, file_version="brain.Event:2")))

    def add_scalar(self, tag: str, value: float, step: int, wall_time: float) -> None:
        self._fh.write(record(encode_event(wall_time, step, tag=tag, value=value)))

    def flush(self) -> None:
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()
