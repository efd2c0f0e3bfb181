"""Sums a `fusec bench --profile --in-program --json FILE` profile by kind of step (the step's
name with its digits dropped): per kind, the steps, their time repeated alone (weights warm in
L2) and their share of the program where they run among the others, largest share first.

    python3 scripts/in_program.py bench.json
"""
import json
import re
import sys
from collections import defaultdict


def main(path):
    with open(path) as f:
        profile = json.load(f).get("profile") or []
    kinds = defaultdict(lambda: [0, 0.0, 0.0])
    for step in profile:
        kind = re.sub(r"\d+", "#", step["step"])[:90]
        k = kinds[kind]
        k[0] += 1
        k[1] += step.get("repeated_ms") or 0.0
        k[2] += step.get("in_program_ms") or 0.0
    total = sum(k[2] for k in kinds.values())
    print(f"{'steps':>5} {'repeated ms':>11} {'in program ms':>13} {'share':>6}  kind ({total:.4f} ms in all)")
    for kind, (n, repeated, share) in sorted(kinds.items(), key=lambda kv: -kv[1][2]):
        print(f"{n:>5} {repeated:>11.4f} {share:>13.4f} {100 * share / max(total, 1e-12):>5.1f}%  {kind}")


if __name__ == "__main__":
    main(sys.argv[1])
