"""``python -m traces ...``: ``python -m traces.convert ...`` with the
converter loaded as ``ddlc import`` loads it (traces/loading.py), for the
workflows' conversions."""

import sys

from traces.loading import converter_loading

with converter_loading():
    from traces import convert

sys.exit(convert.main())
