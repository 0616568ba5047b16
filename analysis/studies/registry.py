"""The registry of study sections: a study's name -> the function that writes its section of report.md (tables,
figures, Markdown) and whether it reads the runs' logged samples.

A sweep spec names its study in ``report: {study: NAME}``; analysis.prereg checks the name against this registry
when the spec is loaded, analysis.report appends the section (and keeps samples.csv.gz in the report's data for a
study that reads samples). A study registers once, where its section is written, with
``@STUDY_SECTIONS.register(NAME)`` (as experiments.diagnostics registers the training step's diagnostics);
analysis.studies imports every study module, so the registry is complete once the package is imported.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

__all__ = ["STUDY_SECTIONS", "StudyRegistry", "StudySection"]


@dataclass(frozen=True)
class StudySection:
    """One registered study.

    Attributes:
        name: the name a spec's ``report.study`` gives.
        write: ``(runs: analysis.load.Runs, out: Path, dpi: int, plan: analysis.prereg.Plan | None) -> list[str]``:
            writes the section's figures and CSVs into ``out`` and returns its Markdown lines; comparisons that
            ``plan`` declares are left out of its exploratory tables.
        reads_samples: the section reads samples.jsonl (the report's data then carries samples.csv.gz).
    """

    name: str
    write: Callable[..., list[str]]
    reads_samples: bool = False


class StudyRegistry:
    """Study name -> :class:`StudySection`, in registration order. Registering a name twice raises ValueError;
    looking up an unknown name raises ValueError listing the registered ones."""

    def __init__(self) -> None:
        self._items: dict[str, StudySection] = {}

    def register(self, name: str, reads_samples: bool = False) -> Callable:
        """``@STUDY_SECTIONS.register("name")`` on a section function (``StudySection.write``)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"a study name must be a non-empty str, got {name!r}")

        def add(write: Callable) -> Callable:
            if name in self._items:
                raise ValueError(f"study {name!r} is already registered")
            self._items[name] = StudySection(name, write, reads_samples)
            return write

        return add

    def get(self, name: str) -> StudySection:
        try:
            return self._items[name]
        except (KeyError, TypeError):
            raise ValueError(f"unknown study {name!r}; valid: {', '.join(self.names())}") from None

    def names(self) -> tuple[str, ...]:
        return tuple(self._items)

    def __contains__(self, name: object) -> bool:
        try:
            return name in self._items
        except TypeError:  # unhashable
            return False

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._items)


STUDY_SECTIONS = StudyRegistry()
"""Every study section report.md can end with; filled when analysis.studies imports its modules."""
