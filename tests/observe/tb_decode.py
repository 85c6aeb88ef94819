#!/usr/bin/env python3
"""Independent check of a TensorBoard event file written by athanor.

usage: tb_decode.py EVENT_FILE EXPECTED_JSON
       tb_decode.py --histograms EVENT_FILE      (structure of every histogram only)

Reads the TFRecord framing by hand, checks both masked CRC-32C values of every
record (CRC computed here, table-driven, not by athanor), decodes each record
with protobuf (Debian python3-protobuf) using Event/Summary/Value/HistogramProto
descriptors built in this script from TensorFlow's summary.proto field numbers,
and compares with EXPECTED_JSON:
  {"file_version": "brain.Event:2",
   "scalars": [{"tag": str, "step": int, "value": float|null(NaN), "wall_time": float}, ...],
   "histograms": [{"tag": str, "step": int, "wall_time": float, "values": [float, ...]}, ...]}
("histograms" optional). A histogram is checked against its raw values, recounted
here: min, max, num, sum, sum_squares, and each bucket's count of values in
(bucket_limit[i-1], bucket_limit[i]] (the first bucket from min). Every histogram,
expected or not, must be consistent: increasing limits ending at max, counts summing
to num. Exit status 0 when everything matches, 1 with a message otherwise.
"""
import json
import math
import struct
import sys

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory


def make_crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


CRC_TABLE = make_crc32c_table()


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = CRC_TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked(crc):
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def event_class():
    """Event { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }"""
    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="athanor_tb_check.proto", package="tbcheck", syntax="proto3")
    summary = fdp.message_type.add(name="Summary")
    value = summary.nested_type.add(name="Value")
    value.field.add(name="tag", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    # summary.proto: `oneof value { float simple_value = 2; ... HistogramProto histo = 5; ... }`:
    # a oneof member has presence, so a 0.0 simple_value is on the wire.
    value.oneof_decl.add(name="value")
    value.field.add(name="simple_value", number=2, type=F.TYPE_FLOAT, label=F.LABEL_OPTIONAL, oneof_index=0)
    histo = fdp.message_type.add(name="HistogramProto")
    for i, n in enumerate(["min", "max", "num", "sum", "sum_squares"]):
        histo.field.add(name=n, number=i + 1, type=F.TYPE_DOUBLE, label=F.LABEL_OPTIONAL)
    for i, n in enumerate(["bucket_limit", "bucket"]):
        histo.field.add(name=n, number=6 + i, type=F.TYPE_DOUBLE, label=F.LABEL_REPEATED,
                        options=descriptor_pb2.FieldOptions(packed=True))
    value.field.add(name="histo", number=5, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                    type_name=".tbcheck.HistogramProto", oneof_index=0)
    summary.field.add(name="value", number=1, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED,
                      type_name=".tbcheck.Summary.Value")
    event = fdp.message_type.add(name="Event")
    event.field.add(name="wall_time", number=1, type=F.TYPE_DOUBLE, label=F.LABEL_OPTIONAL)
    event.field.add(name="step", number=2, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    event.field.add(name="file_version", number=3, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    event.field.add(name="summary", number=5, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                    type_name=".tbcheck.Summary")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    desc = pool.FindMessageTypeByName("tbcheck.Event")
    if hasattr(message_factory, "GetMessageClass"):
        return message_factory.GetMessageClass(desc)
    return message_factory.MessageFactory(pool).GetPrototype(desc)


def read_records(blob):
    records, pos = [], 0
    while pos < len(blob):
        if len(blob) - pos < 12:
            raise ValueError(f"truncated record header at byte {pos}")
        header = blob[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", blob[pos + 8:pos + 12])
        if masked(crc32c(header)) != length_crc:
            raise ValueError(f"record at byte {pos}: length CRC mismatch")
        start, end = pos + 12, pos + 12 + length
        if end + 4 > len(blob):
            raise ValueError(f"record at byte {pos}: length {length} runs past the end of the file")
        data = blob[start:end]
        (data_crc,) = struct.unpack("<I", blob[end:end + 4])
        if masked(crc32c(data)) != data_crc:
            raise ValueError(f"record at byte {pos}: data CRC mismatch")
        records.append(data)
        pos = end + 4
    return records


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def check_histogram_structure(h, where):
    limits, counts = list(h.bucket_limit), list(h.bucket)
    if not limits or len(limits) != len(counts):
        raise ValueError(f"{where}: {len(limits)} bucket limits and {len(counts)} buckets")
    if any(b <= a for a, b in zip(limits, limits[1:])):
        raise ValueError(f"{where}: bucket limits are not increasing")
    if limits[-1] != h.max or h.min > limits[0] or h.min > h.max:
        raise ValueError(f"{where}: min {h.min} / max {h.max} do not bracket the limits {limits[0]}..{limits[-1]}")
    if sum(counts) != h.num or any(c < 0 for c in counts):
        raise ValueError(f"{where}: bucket counts sum to {sum(counts)}, num is {h.num}")


def check_histogram_values(h, values, where):
    import math as m
    vals = [v for v in values if m.isfinite(v)]
    want = {"min": min(vals), "max": max(vals), "num": float(len(vals)), "sum": m.fsum(vals),
            "sum_squares": m.fsum(v * v for v in vals)}
    for k, w in want.items():
        got = getattr(h, k)
        if abs(got - w) > 1e-9 * max(1.0, abs(w)):
            raise ValueError(f"{where}: {k} is {got}, the values give {w}")
    limits = list(h.bucket_limit)
    recount = [0.0] * len(limits)
    for v in vals:
        i = 0
        while limits[i] < v:  # bucket i holds (limits[i-1], limits[i]]
            i += 1
        recount[i] += 1
    if recount != list(h.bucket):
        raise ValueError(f"{where}: bucket counts {list(h.bucket)}, the values give {recount}")


def check(event_path, expected_path):
    with open(event_path, "rb") as f:
        records = read_records(f.read())
    if expected_path is None:
        expected = None
    else:
        with open(expected_path) as f:
            expected = json.load(f)
    Event = event_class()
    events = []
    for i, data in enumerate(records):
        ev = Event()
        ev.ParseFromString(data)
        if ev.SerializeToString() != data:  # canonical encoding: nothing unknown or malformed
            raise ValueError(f"record {i}: does not re-encode to the same bytes")
        events.append(ev)
    version = "brain.Event:2" if expected is None else expected["file_version"]
    if not events or events[0].file_version != version:
        raise ValueError(f"first event must carry file_version {version!r}")
    scalars, histograms = [], []
    for ev in events[1:]:
        if len(ev.summary.value) == 0:
            raise ValueError(f"event at step {ev.step} has no summary values")
        for v in ev.summary.value:
            if v.WhichOneof("value") == "histo":
                check_histogram_structure(v.histo, f"histogram {v.tag!r} at step {ev.step}")
                histograms.append((v.tag, ev.step, v.histo, ev.wall_time))
            else:
                scalars.append((v.tag, ev.step, v.simple_value, ev.wall_time))
    if expected is None:
        if not histograms:
            raise ValueError("no histograms in the file")
        print(f"ok: {len(records)} records, {len(scalars)} scalars, {len(histograms)} histograms, all CRCs valid")
        return
    want_h = expected.get("histograms", [])
    if len(histograms) != len(want_h):
        raise ValueError(f"{len(histograms)} histograms in the file, {len(want_h)} expected")
    for (tag, step, h, wall), w in zip(histograms, want_h):
        if tag != w["tag"] or step != w["step"] or wall != w["wall_time"]:
            raise ValueError(f"histogram {tag!r} step {step} wall {wall}, expected {w['tag']!r} step {w['step']}")
        check_histogram_values(h, w["values"], f"histogram {tag!r} at step {step}")
    want = expected["scalars"]
    if len(scalars) != len(want):
        raise ValueError(f"{len(scalars)} scalars in the file, {len(want)} expected")
    for got, w in zip(scalars, want):
        tag, step, value, wall = got
        wv = float("nan") if w["value"] is None else f32(w["value"])
        same_value = (math.isnan(value) and math.isnan(wv)) or value == wv
        if tag != w["tag"] or step != w["step"] or not same_value or wall != w["wall_time"]:
            raise ValueError(f"got {got}, expected {w}")
    print(f"ok: {len(records)} records, {len(scalars)} scalars, {len(histograms)} histograms, all CRCs valid")


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        if sys.argv[1] == "--histograms":
            check(sys.argv[2], None)
        else:
            check(sys.argv[1], sys.argv[2])
    except (ValueError, KeyError, OSError) as e:
        print(f"tb_decode: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # protobuf DecodeError and the like
        print(f"tb_decode: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
