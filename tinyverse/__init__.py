"""tinyverse: simple, supple, scalable reinforcement learning through one database."""

__version__ = "0.1.0"

from . import explore  # noqa: E402
from .database import Database, connect  # noqa: E402
from .errors import TinyverseError  # noqa: E402
from .experiment import Experiment  # noqa: E402
from .loader import load_experiment  # noqa: E402
from .params import check_params, resume, sync_params  # noqa: E402
from .transitions import Transitions, nstep_transitions  # noqa: E402

__all__ = ["Database", "Experiment", "TinyverseError", "__version__", "connect", "load_experiment"]
__all__ += ["Transitions", "check_params", "explore", "nstep_transitions", "resume", "sync_params"]
