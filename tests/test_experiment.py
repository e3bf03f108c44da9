"""The experiment contract: the base class's defaults, and its errors in the tinyverse tree."""

from tinyverse.errors import ExperimentError, ParamsMismatch, TinyverseError
from tinyverse.experiment import Experiment


def test_experiment_errors_are_tinyverse_errors():
    assert issubclass(ExperimentError, TinyverseError) and issubclass(ParamsMismatch, TinyverseError)


def test_the_rest_has_working_defaults():
    class Exp(Experiment):
        make_env = act = train_step = get_params = set_params = None

    exp = Exp(db="the db")
    assert exp.db == "the db"
    assert exp.initial_memory(3) == {}
    assert exp.session_info() == {}
    assert exp.prepare_training() is None
    assert isinstance(exp.run.settings.session_length, int) and exp.run.settings.session_length > 0
    assert exp.run.updates == 0 and exp.run.options is None
    assert exp.update_count == 0  # an older file's name of run.updates
