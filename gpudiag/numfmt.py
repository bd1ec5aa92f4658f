"""The decimals a person reads (and the one way a title is cut), shared by the analysis (finding titles are data built
there) and the reports (gpudiag/report/numbers.py): two for milliseconds, one for a
percentage, written ``76.0 %`` (a space before the sign). Imports nothing of gpudiag, so
every layer may use it."""

from __future__ import annotations

MS_DIGITS = 2
PCT_DIGITS = 1


def fixed(value: float, digits: int) -> str:
    """``value`` with ``digits`` decimals, a negative zero written ``0``."""
    text = f"{float(value):.{digits}f}"
    return "0" + text[2:] if text.startswith("-0") and float(text) == 0 else text


def ms_text(value: float) -> str:
    """Milliseconds as a number: ``30.81`` (the caller writes the unit)."""
    return fixed(value, MS_DIGITS)


def pct_text(value: float) -> str:
    """A value already in percent, with its sign: ``77.0 %``."""
    return f"{fixed(value, PCT_DIGITS)} %"


def plural(count: int, word: str, many: str | None = None) -> str:
    """``1 step``, ``3 steps``, ``2 problems``: the count and the word as it reads with
    it (``many`` where the plural is not the word plus ``s``)."""
    return f"{count} {word if count == 1 else (many or word + 's')}"


__all__ = ["MS_DIGITS", "PCT_DIGITS", "fixed", "ms_text", "pct_text", "plural"]


def clip_words(text: str, limit: int) -> str:
    """``text`` up to ``limit`` characters, cut at a word's end with an ellipsis: a title
    cut mid-word read as the whole message (probe 28d: "... ranks 0, 1 then lost the")."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    space = cut.rfind(" ")
    if space > limit // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:") + "…"
