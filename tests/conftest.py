"""Hypothesis settings for the whole suite: the `mutation` profile that ./dev mutate selects
(tests/mutation.py). Under mutation testing each test runs once per mutant on a loaded machine,
with mutmut's tracing on: a deadline there fails a correct test on a slow example, and random
examples would let a mutant be killed in one run and survive the next. So that profile has no
deadline and derandomizes (the same examples every run); ordinary runs keep the defaults."""

from __future__ import annotations

from hypothesis import settings

settings.register_profile("mutation", deadline=None, derandomize=True, database=None)
