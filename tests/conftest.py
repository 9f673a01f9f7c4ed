import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
FASHION = Path("/usr/share/datasets/fashion-mnist")


def write_design(folder: Path, doc: dict, name: str = "design.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def ddlc(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddlcompare.cli", *args], cwd=cwd or REPO,
                          capture_output=True, text=True, timeout=300)


# A design small enough to train in seconds: a few steps of real data.
TINY_FIXED = {"epochs": 2, "max_steps": 12, "train_images": 4000, "warmup_steps": 2,
              "timeout_s": 120}


def tiny_design(frameworks=("torch-ddp",), procs=(2,), **fixed) -> dict:
    return {"name": "tiny",
            "factors": {"framework": list(frameworks), "procs_per_node": list(procs),
                        "batch_size": [32]},
            "replications": 1, "fixed": {**TINY_FIXED, **fixed}}
