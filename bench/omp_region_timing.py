#!/usr/bin/env python3
"""Reads omp_region_timing.bin (bench/omp_region_timing.cpp) and prints, per call site of a
parallel region, medians in microseconds: when the main thread and the worker start their
shares after the call, the gap between their ends (worker minus main; positive: the main
thread waited), how long the call took to return after the last share ended, and the whole
call. Usage: omp_region_timing.py [FILE] [--min-calls N]"""
import argparse
import statistics
import struct
import subprocess


def sites(path):
    data = open(path, 'rb').read()
    p = 0
    while p < len(data):
        offset, object_len = struct.unpack_from('qq', data, p)
        p += 16
        obj = data[p:p + object_len].decode(errors='replace')
        p += object_len
        calls, n = struct.unpack_from('qq', data, p)  # calls made, records kept
        p += 16
        records = [struct.unpack_from('5f', data, p + 20 * k) for k in range(n)]
        p += 20 * n
        yield offset, obj, calls, records


def symbol(obj, offset):
    out = subprocess.run(['addr2line', '-f', '-C', '-e', obj, hex(offset)], capture_output=True, text=True).stdout
    name = out.split('\n')[0] if out else '?'
    return name if name != '??' else f'{obj.rsplit("/", 1)[-1]}+{offset:#x}'


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('file', nargs='?', default='omp_region_timing.bin')
    ap.add_argument('--min-calls', type=int, default=10)
    a = ap.parse_args()
    print(f'{"calls":>6} {"main start":>10} {"worker start":>12} {"end gap":>8} {"main first":>10} {"leave":>6} {"call":>8}  site')
    for offset, obj, calls, rec in sites(a.file):
        if calls < a.min_calls or not rec:
            continue
        med = [statistics.median(r[j] for r in rec) for j in range(5)]
        main_first = sum(1 for r in rec if r[2] > 0) / len(rec)
        print(f'{calls:6d} {med[0]:10.1f} {med[1]:12.1f} {med[2]:8.1f} {main_first:10.0%} {med[3]:6.1f} {med[4]:8.1f}  '
              f'{symbol(obj, offset)[:70]}')


if __name__ == '__main__':
    main()
