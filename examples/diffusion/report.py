"""The diffusion report of examples/diffusion's study (docs/analysis.md).

    python examples/diffusion/report.py diffusion-runs [--json]

Awareness of the party and of the candidacy per tick, the network's density, and the
share of awareness answers that are hallucinated (sim.analysis.diffusion).
"""

from __future__ import annotations

import sys
from pathlib import Path

import orjson

from sim.analysis.diffusion import Topic, diffusion_lines, diffusion_report
from sim.errors import SimError

TOPICS = (
    Topic(
        "party",
        "Have you heard of a Valentine's Day party at Hobbs Cafe?",
        ("valentine",),
        "Who did you first hear about the Valentine's Day party at Hobbs Cafe from? Name the "
        "person (yourself if it is your own).",
    ),
    Topic(
        "candidacy",
        "Have you heard that someone is running for mayor of Smallville?",
        ("mayor",),
        "Who did you first hear about the mayoral candidacy from? Name the person (yourself "
        "if it is your own).",
    ),
)


def main(argv: list[str]) -> int:
    args = [a for a in argv if a != "--json"]
    if len(args) != 1:
        print("usage: python examples/diffusion/report.py STUDY_DIR [--json]", file=sys.stderr)
        return 2
    try:
        report = diffusion_report(Path(args[0]), TOPICS)
    except SimError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    if "--json" in argv:
        sys.stdout.write(orjson.dumps(report.to_dict()).decode() + "\n")
    else:
        print("\n".join(diffusion_lines(report)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
