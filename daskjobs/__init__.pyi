# The types of daskjobs' public names, for type checkers (mypy, pyright) only.
# At run time daskjobs/__init__.py imports each name from the same module on first use
# (its _LAZY table; tests/project/test_packaging.py checks that the two agree).

from daskjobs.cache.store import ResultStore as ResultStore
from daskjobs.cache.store import StoreAccessError as StoreAccessError
from daskjobs.errors import AdmissionRefused as AdmissionRefused
from daskjobs.errors import SubmissionRefused as SubmissionRefused
from daskjobs.forecasting import forecast as forecast
from daskjobs.plugin import JobsPlugin as JobsPlugin
from daskjobs.plugin.client import explain as explain
from daskjobs.plugin.client import local_cluster as local_cluster
from daskjobs.plugin.client import set_team as set_team
from daskjobs.plugin.client import start_rate as start_rate
from daskjobs.plugin.client import status as status
from daskjobs.plugin.client.record import record as record
from daskjobs.sweep import ClusterImportError as ClusterImportError
from daskjobs.sweep import Sweep as Sweep
from daskjobs.sweep import SweepCancelled as SweepCancelled
from daskjobs.sweep import SweepInterrupted as SweepInterrupted
from daskjobs.sweep import SweepKeyboardInterrupt as SweepKeyboardInterrupt
from daskjobs.sweep import SweepResult as SweepResult
from daskjobs.sweep import cases as cases
from daskjobs.sweep import grid as grid
from daskjobs.sweep import run as run
from daskjobs.tasks import Preempted as Preempted
from daskjobs.tasks import cancelled as cancelled
from daskjobs.tasks import checkpoint as checkpoint
from daskjobs.tasks import preempted as preempted
from daskjobs.tasks import restore as restore

__version__: str
__all__: list[str]
