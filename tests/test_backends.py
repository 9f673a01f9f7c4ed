"""A new backend is one new file: a launcher dropped into
ddlcompare/run/launchers/ and a framework adapter dropped into frameworks/ are
found with no other change. (Schedulers: tests/test_hosts_launch.py; trace
readers: tests/test_traces_readers.py.)"""

import subprocess
import sys
import textwrap
from pathlib import Path

from ddlcompare.run import launch, launchers
from ddlcompare.run.schedulers import Host

REPO = Path(__file__).resolve().parent.parent


def test_a_new_launcher_is_one_file():
    module = Path(launchers.__file__).parent / "dummy_for_test.py"
    module.write_text(
        textwrap.dedent('''
        from ddlcompare.run.launch import base_env, launcher

        @launcher("dummy-launcher")
        def dummy(hosts, config, run_dir, scheduler):
            return ["echo", scheduler.name, str(len(hosts))], base_env(config)
        ''')
    )
    try:
        argv, env = launch.command(
            "dummy-launcher", [Host("localhost", 2)], {"threads": 3}, Path("/r"), "local"
        )
        assert argv == ["echo", "local", "1"] and env["OMP_NUM_THREADS"] == "3"
    finally:
        module.unlink()
        launch.LAUNCHERS.forget("dummy-launcher")


def test_a_new_framework_is_one_file():
    module = REPO / "frameworks" / "dummy_for_test.py"
    module.write_text(
        textwrap.dedent('''
        from frameworks.registry import AdapterInfo, register

        ADAPTER = register(AdapterInfo(name="dummy-framework", module="frameworks.dummy_for_test",
                                       family="torch", launcher="torchrun", env="torch",
                                       probe="torch.distributed", exposes=("forward",)))
        ''')
    )
    try:
        # A fresh interpreter: the registry is built once per process.
        found = subprocess.run(
            [
                sys.executable,
                "-c",
                "from ddlcompare.plan.params import PARAMS; "
                "print(PARAMS['framework'].check('dummy-framework'))",
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert found.stdout.strip() == "None", found.stderr
    finally:
        module.unlink()
