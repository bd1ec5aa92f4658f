"""Precision and recall of `gpudiag lint` on each part of the labelled corpus (issue 30).

The corpus (tests/lint_corpus) is linted in one run, as tools/lint_corpus.py does, and the
findings and labels are split by project into three parts:

- original:  the projects of the first corpus (issue 10), which the rules were built on;
- tuned:     the projects added for issue 30 that the rule changes were tuned on;
- held-out:  the projects listed in tests/lint_corpus/HELD_OUT, linted once after the rule
             changes; its error classes were fixed afterwards, so it is no longer held out;
- held-out-2: the projects of tests/lint_corpus/HELD_OUT_2, added after those fixes and
             linted once; its error classes were fixed afterwards too;
- held-out-3: the projects of tests/lint_corpus/HELD_OUT_3, chosen and fetched before
             those fixes, linted once after them, with no rule change after (the held-out
             parts are printed only with --held-out).

    python bench/lint_corpus_split.py [--held-out] [--details]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "tests" / "lint_corpus"
ADDED_FOR_ISSUE_30 = [
    "accelerate_examples",
    "barlowtwins",
    "blip",
    "convnext",
    "deit",
    "detectron2",
    "dino",
    "improved_diffusion",
    "llm_c",
    "modded_nanogpt",
    "swin_transformer",
    "timm",
    "vicreg",
]
PARTS = ("original", "tuned", "held-out", "held-out-2", "held-out-3")


def load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "lint_corpus_tool", REPO / "tools" / "lint_corpus.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def held_out(corpus: Path = CORPUS, name: str = "HELD_OUT") -> set[str]:
    lines = (corpus / name).read_text().splitlines()
    return {line.strip() for line in lines if line.strip() and not line.startswith("#")}


def part_of(
    path: str,
    held: set[str],
    held_2: frozenset[str] | set[str] = frozenset(),
    held_3: frozenset[str] | set[str] = frozenset(),
) -> str:
    project = path.split("/", 1)[0]
    if project in held_3:
        return "held-out-3"
    if project in held_2:
        return "held-out-2"
    if project in held:
        return "held-out"
    return "tuned" if project in ADDED_FOR_ISSUE_30 else "original"


def split(score: object, part: str, corpus: Path = CORPUS) -> object:
    """The tool's Score restricted to the files of one part."""
    tool = sys.modules["lint_corpus_tool"]
    held = held_out(corpus)
    held_2 = held_out(corpus, "HELD_OUT_2")
    held_3 = held_out(corpus, "HELD_OUT_3")

    def keep(keys: set[tuple[str, int, str]]) -> set[tuple[str, int, str]]:
        return {key for key in keys if part_of(key[0], held, held_2, held_3) == part}

    labels = tool.Labels(keep(score.labels.expect), keep(score.labels.must_not))  # type: ignore[attr-defined]
    return tool.Score(keep(score.found), labels, score.errors)  # type: ignore[attr-defined]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--held-out", action="store_true", help="also score the held-out part")
    parser.add_argument("--details", action="store_true", help="list FP and FN per part")
    args = parser.parse_args(argv)
    tool = load_tool()
    whole = tool.score(CORPUS)
    for part in PARTS:
        if part.startswith("held-out") and not args.held_out:
            continue
        table = tool.table(split(whole, part)).splitlines()
        print(f"## {part}")
        shown = table if args.details else [line for line in table if not line.startswith("false")]
        print("\n".join(shown[2:]))
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
