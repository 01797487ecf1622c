# The types of daskjobs.jobs' public names, for type checkers (mypy, pyright) only.
# At run time daskjobs/jobs/__init__.py imports the ledger and the model at once and the
# rest from the same modules on first use (its _LAZY table; tests/project/test_packaging.py checks
# that the two agree).

import builtins

from daskjobs.jobs.api import Job as Job
from daskjobs.jobs.api import JobFailed as JobFailed
from daskjobs.jobs.api import list_jobs as list_jobs
from daskjobs.jobs.api import submit as submit
from daskjobs.jobs.ledger import SCHEMA_VERSION as SCHEMA_VERSION
from daskjobs.jobs.ledger import Fenced as Fenced
from daskjobs.jobs.ledger import Ledger as Ledger
from daskjobs.jobs.ledger import LedgerError as LedgerError
from daskjobs.jobs.ledger import default_url as default_url
from daskjobs.jobs.model import ATTEMPT_MOVES as ATTEMPT_MOVES
from daskjobs.jobs.model import ATTEMPT_STATES as ATTEMPT_STATES
from daskjobs.jobs.model import JOB_MOVES as JOB_MOVES
from daskjobs.jobs.model import JOB_STATES as JOB_STATES
from daskjobs.jobs.model import KINDS as KINDS
from daskjobs.jobs.model import LIVE_ATTEMPTS as LIVE_ATTEMPTS
from daskjobs.jobs.model import AttemptRecord as AttemptRecord
from daskjobs.jobs.model import JobInfo as JobInfo
from daskjobs.jobs.model import JobRecord as JobRecord
from daskjobs.jobs.model import JobSpec as JobSpec
from daskjobs.jobs.model import JobSpecError as JobSpecError
from daskjobs.jobs.model import Progress as Progress
from daskjobs.jobs.model import StaleTransition as StaleTransition
from daskjobs.jobs.model import next_step as next_step
from daskjobs.jobs.runner import Attempt as Attempt
from daskjobs.jobs.service import JobsService as JobsService
from daskjobs.jobs.sweeps import submit_sweep as submit_sweep

#: ``daskjobs.jobs.list(client)``: the ledger's jobs (:func:`list_jobs`).
list = list_jobs

__all__: builtins.list[str]
