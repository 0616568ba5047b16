"""Score cards: a battery of runs per objective, its measures, validation, report and figure. Stands on the
sweeper and on analysis."""
