#!/usr/bin/env python3
"""The doctor's catalogue: broken runs it must diagnose, healthy runs it must leave alone.

usage: run_catalogue.py ATHANOR_CLI WORK_DIR [--fast] [--only NAME[,NAME...]] [--mpirun MPIEXEC] [--doctor-only]

For each entry of catalogue.json (beside this script), in order:
  1. `athanor train CONFIG out_dir=WORK_DIR name=ENTRY OVERRIDES...` (under mpirun when the
     entry says so), from the repository root, as a user would;
  2. `athanor doctor WORK_DIR/ENTRY --json` (with --baseline WORK_DIR/BASELINE when given);
  3. checks: a broken run's first (most likely) finding has the expected kind, `doctor`
     exits 1, and the fix names the expected config key with a value in the expected range
     (or the expected text or detail); a healthy run has no finding and `doctor` exits 0.
Prints the confusion table (expected kind against the kinds reported) and exits 1 when any
entry is wrong. --fast runs the entries marked "fast" (the fast test suite's subset);
--doctor-only diagnoses the run directories a previous call left in WORK_DIR again
(after a change to the doctor) without training.
"""
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))


def check_fix(spec, finding):
    """spec: {key: value | {"min": a, "max": b}}; every key must be in the finding's fix."""
    problems = []
    fix = finding.get("fix", {})
    for key, want in spec.items():
        if key not in fix:
            problems.append(f"no fix for {key} (fix: {fix})")
            continue
        got = fix[key]
        if isinstance(want, dict):
            try:
                v = float(got)
            except ValueError:
                problems.append(f"{key}: {got!r} is not a number")
                continue
            if "min" in want and v < want["min"] or "max" in want and v > want["max"]:
                problems.append(f"{key}: {v} not in [{want.get('min', '-inf')}, {want.get('max', 'inf')}]")
        elif str(got) != str(want):
            problems.append(f"{key}: {got!r}, expected {want!r}")
    return problems


def run_entry(cli, work, e, mpiexec, doctor_only=False):
    name = e["name"]
    config = os.path.join(HERE, e["config"]) if not e["config"].startswith("examples/") else os.path.join(ROOT, e["config"])
    overrides = [o.replace("{work}", work) for o in e.get("overrides", [])]
    cmd = [cli, "train", config, f"out_dir={work}", f"name={name}"] + overrides
    np = e.get("mpirun", 0)
    if np:
        cmd = [mpiexec, "--oversubscribe", "--allow-run-as-root", "--mca", "btl_vader_single_copy_mechanism", "none",
               "-x", "OMP_NUM_THREADS", "-np", str(np)] + cmd
    env = dict(os.environ)
    if np:
        env["OMP_NUM_THREADS"] = "1"
    t0 = time.time()
    log_path = os.path.join(work, name + ".train.log")
    rc_path = os.path.join(work, name + ".train.rc")
    if doctor_only and os.path.exists(rc_path):
        with open(rc_path) as f:
            train_rc = int(f.read())
    else:
        with open(log_path, "w") as log:
            train_rc = subprocess.call(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
        with open(rc_path, "w") as f:
            f.write(str(train_rc))
    train_s = time.time() - t0
    problems = []
    want_train = e.get("train_exit", "ok")
    if (want_train == "ok") != (train_rc == 0):
        problems.append(f"athanor train exited {train_rc} (expected {want_train}); see {log_path}")
    doctor = [cli, "doctor", os.path.join(work, name), "--json"]
    if e.get("baseline"):
        doctor += ["--baseline", os.path.join(work, e["baseline"])]
    p = subprocess.run(doctor, cwd=ROOT, capture_output=True, text=True)
    try:
        report = json.loads(p.stdout)
    except json.JSONDecodeError:
        return {"name": name, "expect": e["expect"], "kinds": ["(doctor failed)"], "ok": False, "seconds": train_s,
                "problems": problems + [f"doctor exited {p.returncode}: {p.stderr.strip()[:400]}"], "fix": {}}
    findings = report.get("findings", [])
    kinds = [f["kind"] for f in findings]
    expect = e["expect"]
    if expect == "healthy":
        if findings:
            problems.append("findings on a healthy run: " + "; ".join(f["kind"] + ": " + f["message"] for f in findings))
        if p.returncode != 0:
            problems.append(f"doctor exited {p.returncode} on a healthy run")
        fix = {}
    else:
        if not findings:
            problems.append("no finding")
            fix = {}
        else:
            first = findings[0]
            fix = first.get("fix", {})
            if first["kind"] != expect:
                problems.append(f"first finding is {first['kind']}, expected {expect}")
            problems += check_fix(e.get("fix", {}), first)
            if "message" in e and e["message"] not in first["message"] + " ".join(first.get("suggestions", [])):
                problems.append(f"the message lacks {e['message']!r}: {first['message']}")
            for k, v in e.get("details", {}).items():
                got = first.get("details", {}).get(k)
                if got is None or str(v) not in str(got).split(","):
                    problems.append(f"details[{k}] is {got!r}, expected {v!r}")
        if p.returncode != 1:
            problems.append(f"doctor exited {p.returncode} on a broken run (expected 1)")
    return {"name": name, "expect": expect, "kinds": kinds, "ok": not problems, "problems": problems, "seconds": train_s, "fix": fix}


def main():
    args = sys.argv[1:]
    if len(args) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    cli, work = os.path.abspath(args[0]), os.path.abspath(args[1])
    fast = "--fast" in args
    only = None
    mpiexec = "mpirun"
    for i, a in enumerate(args):
        if a == "--only":
            only = set(args[i + 1].split(","))
        if a == "--mpirun":
            mpiexec = args[i + 1]
    with open(os.path.join(HERE, "catalogue.json")) as f:
        entries = json.load(f)
    if not os.path.exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"):
        print("SKIP: dataset-fashion-mnist is not installed (scripts/setup.sh installs it)")
        return 77
    os.makedirs(work, exist_ok=True)
    chosen = [e for e in entries if (not fast or e.get("fast")) and (only is None or e["name"] in only)]
    # A baseline runs before the entries that compare with it.
    names = {e["name"] for e in chosen}
    for e in list(chosen):
        if e.get("baseline") and e["baseline"] not in names:
            chosen.insert(0, next(b for b in entries if b["name"] == e["baseline"]))
            names.add(e["baseline"])
    results = []
    for e in chosen:
        r = run_entry(cli, work, e, mpiexec, "--doctor-only" in args)
        results.append(r)
        status = "ok  " if r["ok"] else "FAIL"
        print(f"{status} {r['name']} ({r['seconds']:.0f} s train): expected {r['expect']}, reported {r['kinds'] or ['none']}",
              flush=True)
        for pr in r["problems"]:
            print(f"       {pr}", flush=True)
    # The confusion table: rows are the runs, the columns what the doctor reported.
    w = max(len(r["name"]) for r in results)
    print("\nconfusion table (first reported kind = the doctor's diagnosis; further kinds in brackets)")
    print(f"{'run':<{w}}  {'expected':<22} {'diagnosed':<22} {'fix named':<44} result")
    for r in results:
        diag = r["kinds"][0] if r["kinds"] else "healthy"
        extra = (" [+" + ",".join(r["kinds"][1:]) + "]") if len(r["kinds"]) > 1 else ""
        fix = ", ".join(f"{k}: {v}" for k, v in r["fix"].items())
        print(f"{r['name']:<{w}}  {r['expect']:<22} {diag + extra:<22} {fix:<44} {'ok' if r['ok'] else 'WRONG'}")
    broken = [r for r in results if r["expect"] != "healthy"]
    healthy = [r for r in results if r["expect"] == "healthy"]
    print(f"\nbroken runs diagnosed right: {sum(r['ok'] for r in broken)}/{len(broken)}; "
          f"healthy runs left alone: {sum(r['ok'] for r in healthy)}/{len(healthy)}")
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
