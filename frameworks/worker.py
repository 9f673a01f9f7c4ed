"""Entry point of every training process: ``python -m frameworks.worker RUN_DIR``.

The launcher starts one of these per rank; each reads the run's config.json
and hands it to its framework family's shared loop.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

from runfiles.names import CONFIG
from runfiles import ownership
from runfiles.ranks import launcher_rank
from frameworks import registry
from frameworks.common import RunError
from frameworks.data import DataError


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("run_dir", type=Path)
    args = parser.parse_args(argv)
    ownership.watch_from_worker(args.run_dir)  # stop at once if the runner dies
    config = json.loads((args.run_dir / CONFIG).read_text())
    info = registry.FRAMEWORKS[config["framework"]]
    loop = importlib.import_module(info.loop)
    try:
        loop.train(registry.load_adapter(info.name), config, args.run_dir)
    except (RunError, DataError) as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        sys.exit(3)
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
        # A rank leaving quietly mid-run makes its peers fail with
        # "Connection reset by peer": name the real cause first, and fail.
        print(
            f"EarlyExit: rank {launcher_rank()} exited with status 0 before its training "
            "finished (sys.exit(0) in the training code?); the other ranks' errors "
            "follow from it",
            file=sys.stderr,
            flush=True,
        )
        sys.exit(3)


if __name__ == "__main__":
    main()
