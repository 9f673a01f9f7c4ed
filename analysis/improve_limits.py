"""The two numbers of ``ddlc improve``'s test that its command line states
(analysis/improve.py holds the rule): apart from improve.py, which loads the
statistics, so that ``ddlc --help`` states them without loading anything."""

MIN_REPLICATIONS = 5  # runs per level and cell of the test, at least
TOP = 3  # hypotheses tested by default (--top)
