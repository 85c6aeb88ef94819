#!/bin/bash
# report.html in a real browser: builds a run directory from a synthetic metrics.jsonl
# (200 steps, evals every 20, a loss spike, an f16 loss scale, a health event, per-layer
# statistics every 10 steps, running time totals), lr_find.json, batch_find.json and a
# config.yaml, runs `athanor report`, checks that the page has the training time and the
# per-layer, lr-find and batch-find views, takes a headless Chromium screenshot, and fails
# on any console error, on a missing or tiny PNG, or on a blank page.
#   usage: report_screenshot.sh ATHANOR_CLI [WORK_DIR]   (WORK_DIR defaults to ./report_screenshot)
set -euo pipefail
cli=${1:?usage: report_screenshot.sh ATHANOR_CLI [WORK_DIR]}
work=$(realpath -m "${2:-report_screenshot}")
py=/usr/bin/python3; [ -x "$py" ] || py=python3

chromium_bin=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$chromium_bin" ]; then
  echo "FAIL: chromium not found; install it with 'apt-get install chromium' (scripts/setup.sh does)" >&2
  exit 1
fi

rm -rf "$work"
run="$work/run"
mkdir -p "$run"

"$py" - "$run" <<'PY'
import json, math, sys
run = sys.argv[1]
with open(f"{run}/metrics.jsonl", "w") as f:
    scale = 65536.0
    for s in range(1, 201):
        loss = 4.0 * math.exp(-s / 60) + 1.2 + 0.05 * math.sin(s)
        if s == 120:
            loss = 6.5  # the spike the health event is about
        if s in (50, 51):
            scale /= 2
        gn = 1.5 + math.cos(s / 7) + (8 if s == 120 else 0)
        f.write(json.dumps({
            "step": s, "loss": loss, "lr": 6e-4 * min(1, s / 20) * (0.5 + 0.5 * math.cos(math.pi * s / 200)),
            "grad_norm": gn, "grad_norm_clipped": min(gn, 1.0), "skipped": s == 51, "skipped_total": int(s >= 51),
            "loss_scale": scale, "targets": 8192, "throughput": 20000 + 500 * math.sin(s / 10),
            "step_s": 0.41, "data_s": 0.01, "forward_s": 0.13, "backward_s": 0.22, "optimizer_s": 0.05, "comm_s": 0.0,
            "mfu": 0.31, "mem": {"parameter": {"cur": 50 << 20, "peak": 50 << 20},
                                 "activation": {"cur": 0, "peak": (300 << 20) + s * 4096},
                                 "optimizer_state": {"cur": 100 << 20, "peak": 100 << 20}},
            # every step is logged here; elapsed_s includes evaluations, totals every step
            "elapsed_s": 0.45 * s + 2.0 * (s // 20),
            "totals": {"steps": s, "step_s": 0.41 * s, "data_s": 0.01 * s, "forward_s": 0.13 * s,
                       "backward_s": 0.22 * s, "optimizer_s": 0.05 * s, "comm_s": 0.0},
            **({"layers": {f"h.{l}.{w}.weight": {"grad": 0.3 / (1 + l), "param": 10.0,
                                                  "update": 10 ** (-2 - l * 0.5 - s / 200), "dim": 2}
                           for l in range(6) for w in ("attn", "mlp")},
                "acts": {f"h.{l}.mlp:linear_relu": {"mean": 0.4, "std": 1.0, "absmax": 5.0, "zero": 0.5,
                                                    "dead": min(1.0, 0.05 * l * s / 100), "units": 512}
                         for l in range(6)}} if s % 10 == 0 else {})}) + "\n")
        if s % 20 == 0:
            f.write(json.dumps({"step": s, "val_loss": 4.1 * math.exp(-s / 70) + 1.3}) + "\n")
    f.write('{"step": 201, "loss": 1.3, "lr"')  # a crash mid-line
with open(f"{run}/health.jsonl", "w") as f:
    f.write(json.dumps({"step": 120, "kind": "loss_spike", "severity": "warning",
                        "message": "loss 6.5 is 4.1x the running mean <1.6>",
                        "suggestions": ["lower the learning rate", "inspect the batch's samples"],
                        "details": {"sample_ids": "[17, 933]"}}) + "\n")
with open(f"{run}/lr_find.json", "w") as f:
    pts = [{"lr": 1e-6 * 10 ** (k / 10), "loss": 5.5 - 3 * (1 / (1 + math.exp(-(k - 30) / 5))) + (0 if k < 52 else (k - 52) ** 2 * 0.1),
            "smoothed": 5.5 - 3 * (1 / (1 + math.exp(-(k - 28) / 5))) + (0 if k < 52 else (k - 52) ** 2 * 0.1)} for k in range(60)]
    f.write(json.dumps({"config": "examples/gpt-char.yaml", "steps": 60, "min_lr": 1e-6, "max_lr": 1.0, "steepest_lr": 6.3e-4,
                        "diverged_lr": 0.25, "suggested_lr": 6.3e-4, "suggestion_rule": "the steepest descent",
                        "config_lr": 6e-4, "points": pts}))
with open(f"{run}/batch_find.json", "w") as f:
    probes = [{"batch": b, "peak_bytes": (200 + 6 * b) * 2 ** 20, "fits": (200 + 6 * b) <= 2048, "throughput": 900 * b ** 0.5,
               "note": ""} for b in (1, 2, 4, 8, 16, 32, 64, 128, 512, 256, 384, 320, 288, 304)]
    f.write(json.dumps({"config": "examples/gpt-char.yaml", "memory_budget": 2 ** 31, "max_micro_batch": 304,
                        "target_global_batch": 512, "accum_steps": 2, "world_size": 1, "probes": probes}))
with open(f"{run}/config.yaml", "w") as f:
    f.write("model:\n  kind: gpt\n  n_layer: 4\ntrain:\n  steps: 200\n  lr: 6.0e-4\nprecision: f16\n")
PY

report=$("$cli" report "$run")
echo "report: $report"
[ -f "$run/report.html" ] || { echo "FAIL: $run/report.html was not written" >&2; exit 1; }
[ "$report" = "$run/report.html" ] || { echo "FAIL: athanor report printed '$report', expected $run/report.html" >&2; exit 1; }

png="$work/report.png"
log="$work/chromium.log"
# The profile dir keeps chromium from touching ~/.config; timeout bounds a hung browser.
timeout 90 "$chromium_bin" --headless --no-sandbox --disable-gpu --enable-logging=stderr --v=0 \
  --user-data-dir="$work/profile" --screenshot="$png" --window-size=1280,5200 "file://$run/report.html" 2>"$log" || {
  echo "FAIL: chromium exited with status $?; its log:" >&2; cat "$log" >&2; exit 1; }

# The page has no scripts, so any console line at all (an error, an uncaught exception, a
# failed resource load) is a fault; Chromium logs them as "...:CONSOLE(n)] ..." lines.
if grep -E ":CONSOLE|Uncaught" "$log" >/dev/null; then
  echo "FAIL: console output while rendering the report:" >&2
  grep -E "CONSOLE|Uncaught" "$log" >&2
  exit 1
fi
[ -f "$png" ] || { echo "FAIL: no screenshot at $png; chromium log:" >&2; cat "$log" >&2; exit 1; }
size=$(stat -c %s "$png")
[ "$size" -gt 5000 ] || { echo "FAIL: screenshot $png is only $size bytes" >&2; exit 1; }

# Decode the PNG with the standard library and count distinct colours: a blank or
# single-colour page has very few; charts in several colours with text have many.
"$py" - "$png" <<'PY'
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
pos, idat, w = 8, b"", 0
while pos < len(data):
    n, kind = struct.unpack(">I4s", data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    if kind == b"IHDR":
        w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
        assert depth == 8 and ctype in (2, 6), f"unexpected PNG format depth {depth} colour type {ctype}"
        bpp = 3 if ctype == 2 else 4
    elif kind == b"IDAT":
        idat += body
    pos += 12 + n
raw = zlib.decompress(idat)
stride = w * bpp
prev = bytearray(stride)
colours = set()
non_white = 0
for y in range(h):
    f = raw[y * (stride + 1)]
    line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    for i in range(stride):  # undo the PNG row filters
        a = line[i - bpp] if i >= bpp else 0
        b = prev[i]
        c = prev[i - bpp] if i >= bpp else 0
        if f == 1: line[i] = (line[i] + a) & 255
        elif f == 2: line[i] = (line[i] + b) & 255
        elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    if y % 4 == 0:
        for x in range(0, w, 2):
            px = bytes(line[x * bpp:x * bpp + 3])
            colours.add(px)
            non_white += px != b"\xff\xff\xff"
    prev = line
print(f"screenshot {w}x{h}: {len(colours)} distinct colours, {non_white} sampled non-white pixels")
if len(colours) < 20 or non_white < 2000:
    sys.exit("FAIL: the screenshot looks blank")
PY
# The new views must be on the page: the wall-clock time and phase totals, the per-layer
# heat maps, the learning-rate range test and the micro-batch search.
for want in "wall-clock (start of training to the last step)" "over all 200 steps" 'class="chart heatmap"' \
            "Learning-rate range test" "Micro-batch search" "h.5.mlp.weight"; do
  grep -qF "$want" "$run/report.html" || { echo "FAIL: report.html lacks '$want'" >&2; exit 1; }
done

echo "screenshot: $png"
