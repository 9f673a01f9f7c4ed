"""Snakemake's own workflow tests for executor plugins
(``snakemake.common.tests.TestWorkflowsLocalStorageBase``: a simple workflow
and one of group jobs), run through this plugin against a real OAR.

Run them on an OAR frontend, as a user OAR accepts jobs of (it refuses
root's), from a folder the nodes share:

    python -m pytest tests/ --basetemp "$HOME/oar-plugin-tests"
"""

import os
import shutil
from typing import Optional

import pytest
import snakemake.common.tests
from snakemake_interface_executor_plugins.settings import ExecutorSettingsBase

from snakemake_executor_plugin_oar import ExecutorSettings

if not shutil.which("oarsub"):
    pytest.skip("oarsub not found: run on an OAR frontend", allow_module_level=True)
if os.geteuid() == 0:
    pytest.skip("OAR refuses root's jobs: run as an OAR user", allow_module_level=True)


class TestWorkflows(snakemake.common.tests.TestWorkflowsLocalStorageBase):
    __test__ = True

    def get_executor(self) -> str:
        return "oar"

    def get_executor_settings(self) -> Optional[ExecutorSettingsBase]:
        # A short walltime: the jobs take seconds, and OAR places short jobs first.
        return ExecutorSettings(default_walltime=5)
