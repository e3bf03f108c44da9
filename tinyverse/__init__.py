"""tinyverse: simple, supple, scalable reinforcement learning through one database."""

__version__ = "0.1.0"

from . import explore  # noqa: E402
from .database import Database, connect  # noqa: E402
from .errors import TinyverseError  # noqa: E402
from .experiment import Experiment  # noqa: E402
from .loader import load_experiment  # noqa: E402
from .params import check_params, resume, sync_params  # noqa: E402
from .settings import Settings  # noqa: E402
from .transitions import Transitions, nstep_transitions  # noqa: E402

__all__ = ["Database", "Experiment", "Settings", "TinyverseError", "__version__", "connect"]
__all__ += ["Transitions", "check_params", "explore", "load_experiment", "nstep_transitions"]
__all__ += ["resume", "sync_params"]
