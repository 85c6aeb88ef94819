#!/usr/bin/env python3
"""The layer order of DESIGN.md ("Layers"), enforced from the #include lines.

Every file under src/, include/ and apps/ belongs to a layer (by its folder); every
#include "..." of it names a file of a layer. A layer may use only itself and the layers
above it in the list below; an include that reaches a lower layer (a back-edge) is
reported with the file, the line and both layers, and the check fails.

  check_layers.py ROOT                 check the tree at ROOT (exit 1 on any back-edge)
  check_layers.py ROOT --expect REGEX  a planted-fixture run: pass only if back-edges are
                                       found and one of the reports matches REGEX
"""
import argparse
import os
import re
import sys

# DESIGN.md "Layers", top to bottom: a layer may include only those at or above it.
LAYERS = ["core", "backend", "autograd", "ops", "amp", "nn", "optim", "data", "dist", "ckpt", "observe", "plan",
          "train", "app"]
RANK = {name: i for i, name in enumerate(LAYERS)}
# Umbrella headers a user includes (the whole public API, or everything of the tensor
# library): they belong to the layer of the highest file they pull in.
UMBRELLAS = {"include/athanor/athanor.h": "train", "include/athanor/ops.h": "ops"}
# "file" includes, and <athanor/...> ones (a project header reached through the include path).
INCLUDE = re.compile(r'^\s*#\s*include\s+(?:"([^"]+)"|<(athanor/[^>]+)>)')


def layer_of_path(rel):
    """The layer of a file of the tree, by its path relative to the root (None: not layered)."""
    if rel in UMBRELLAS:
        return UMBRELLAS[rel]
    parts = rel.split("/")
    if parts[0] == "apps":
        return "app"
    if parts[0] == "src" and len(parts) > 2:
        return parts[1] if parts[1] in RANK else None
    if parts[:2] == ["include", "athanor"] and len(parts) > 3:
        return parts[2] if parts[2] in RANK else None
    return None


def resolve(root, including_rel, target):
    """The path (relative to root) an include names, or None for files outside the tree."""
    here = os.path.dirname(including_rel)
    for base in (here, "include", "src"):
        cand = os.path.normpath(os.path.join(base, target))
        if os.path.isfile(os.path.join(root, cand)):
            return cand
    return None


def scan(root):
    edges, violations = 0, []
    for top in ("src", "include", "apps"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if not f.endswith((".h", ".hpp", ".cpp", ".cu", ".cuh")):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, f), root)
                mine = layer_of_path(rel)
                if mine is None:
                    continue
                with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as fh:
                    for lineno, line in enumerate(fh, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        name = m.group(1) or m.group(2)
                        target = resolve(root, rel, name)
                        theirs = layer_of_path(target) if target else None
                        if theirs is None:
                            continue
                        edges += 1
                        if RANK[theirs] > RANK[mine]:
                            violations.append(f"{rel}:{lineno}: layer '{mine}' includes \"{name}\" of layer "
                                              f"'{theirs}', below it (the order: {' > '.join(LAYERS)})")
    return edges, violations


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root")
    ap.add_argument("--expect", help="regex one report must match (a planted back-edge)")
    args = ap.parse_args()
    if not os.path.isdir(args.root):
        print(f"check_layers: no directory '{args.root}'\nhint: pass the source tree's root", file=sys.stderr)
        return 2
    edges, violations = scan(args.root)
    for v in violations:
        print(v)
    if args.expect is not None:
        if not violations:
            print(f"check_layers: the planted back-edge in {args.root} was not caught ({edges} includes read)")
            return 1
        if not any(re.search(args.expect, v) for v in violations):
            print(f"check_layers: no report matches '{args.expect}'")
            return 1
        print(f"check_layers: the planted back-edge was caught ({edges} includes read)")
        return 0
    if edges == 0:
        print(f"check_layers: no includes found under {args.root}\nhint: pass the source tree's root")
        return 1
    print(f"check_layers: {edges} includes between layers read, {len(violations)} back-edges")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
