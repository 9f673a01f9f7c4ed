"""The numbers of the later stages (``ddlc follow-up``, ``ddlc improve``)
that the command line states: apart from analysis/followup.py and
analysis/improve.py, which hold the rules and load the statistics, so that
``ddlc --help`` states them without loading anything."""

FOLLOW_UP_MIN_REPLICATIONS = 3  # the follow-up's runs per chosen cell, at least
IMPROVE_MIN_REPLICATIONS = 5  # runs per level and cell of improve's test, at least
TOP = 3  # hypotheses improve tests by default (--top)
