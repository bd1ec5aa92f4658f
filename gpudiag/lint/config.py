"""`[tool.gpudiag.lint]` select / ignore from the nearest pyproject.toml, and code selection."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import tomllib

from gpudiag.lint.rules import RULES


class ConfigError(ValueError):
    """A pyproject.toml whose [tool.gpudiag.lint] table cannot be used."""


@dataclass(frozen=True)
class Selection:
    select: tuple[str, ...] | None = None  # None: every rule on by default
    ignore: tuple[str, ...] = ()

    def enabled(self, code: str) -> bool:
        """Selected (by default: every rule on by default; an opt-in rule only when a
        `select` prefix names it) and not ignored."""
        if self.select is None:
            if code in RULES and not RULES[code].default:
                return False
        elif not any(code.startswith(p) for p in self.select):
            return False
        return not any(code.startswith(prefix) for prefix in self.ignore)


def check_codes(codes: list[str] | tuple[str, ...], origin: str) -> tuple[str, ...]:
    """Codes or prefixes (`GD3` selects GD301, GD302); unknown ones are an error."""
    result = []
    for code in codes:
        if not isinstance(code, str):
            raise ConfigError(f"{origin}: rule codes must be strings, got {code!r}")
        code = code.strip().upper()
        if code in ("ALL", "GD"):
            code = "GD"
        elif not any(known.startswith(code) for known in RULES) or not code.startswith("GD"):
            raise ConfigError(f"{origin}: unknown rule code {code!r}")
        result.append(code)
    return tuple(result)


def find_pyproject(start: Path) -> Path | None:
    directory = start.resolve() if start.is_dir() else start.resolve().parent
    for folder in (directory, *directory.parents):
        candidate = folder / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def load_config(pyproject: Path) -> Selection:
    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"{pyproject}: cannot read: {error}") from None
    table = data.get("tool", {}).get("gpudiag", {}).get("lint", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{pyproject}: [tool.gpudiag.lint] must be a table")
    select = table.get("select")
    ignore = table.get("ignore", [])
    for key, value in (("select", select), ("ignore", ignore)):
        if value is not None and not isinstance(value, list):
            raise ConfigError(f"{pyproject}: [tool.gpudiag.lint] {key} must be a list of codes")
    origin = f"{pyproject} [tool.gpudiag.lint]"
    return Selection(
        select=check_codes(select, origin) if select is not None else None,
        ignore=check_codes(ignore, origin),
    )


class SelectionResolver:
    """Selection per file; pyproject files are looked up and read once per lint run."""

    def __init__(self, select: tuple[str, ...] | None, ignore: tuple[str, ...]) -> None:
        self.select, self.ignore = select, ignore
        self._by_directory: dict[Path, Selection] = {}
        self._configs: dict[Path, Selection] = {}  # one read per pyproject.toml

    def for_file(self, path: Path) -> Selection:
        """Command-line select replaces the configured one; ignores add up."""
        directory = path.resolve().parent
        if directory not in self._by_directory:
            pyproject = find_pyproject(directory)
            if pyproject is not None and pyproject not in self._configs:
                self._configs[pyproject] = load_config(pyproject)
            configured = self._configs[pyproject] if pyproject else Selection()
            self._by_directory[directory] = Selection(
                select=self.select if self.select is not None else configured.select,
                ignore=configured.ignore + self.ignore,
            )
        return self._by_directory[directory]
