"""export / import / eval --params: a trained agent leaves the database and comes back, on either backend."""

import ast
import subprocess
import sys

import numpy as np
import pytest
from conftest import IN_CI, ROOT, optional, run_cli, sets

from tinyverse.cli import main
from tinyverse.database import connect

FAKE = ROOT / "tests" / "fake_experiment.py"


def returns(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith(("episode", "mean return"))]


@pytest.fixture
def redis_prefix(redis_url, prefix):
    """A fresh namespace in the test Redis: the prefix fixture removes its keys afterwards."""
    return prefix


def test_export_import_eval_across_backends(tmp_path, redis_url, redis_prefix):
    """SQLite -> file -> Redis: the same greedy returns on the same seed, from the file too, versions kept."""
    sqlite = f"sqlite:///{tmp_path / 'run.db'}"
    run_cli(FAKE, "play", "-n", "3", "-q", "--db", sqlite, "--set", "w_rows=5", "--set", "epsilon=0.3")
    run_cli(FAKE, "train", "-n", "4", "-s", "2", "-q", "--db", sqlite)
    out = run_cli(FAKE, "export", "-o", tmp_path / "agent.safetensors", "--db", sqlite).stdout
    assert "params version 3" in out, out  # the player's init (1), then two publications of the trainer
    before = returns(run_cli(FAKE, "eval", "-n", "3", "--seed", "7", "--no-record", "--db", sqlite).stdout)
    assert len(before) == 4 and "(params v3)" in before[-1], before

    imported = run_cli(FAKE, "import", tmp_path / "agent.safetensors", "--db", redis_url, "--prefix", redis_prefix)
    assert "params version 3" in imported.stdout
    moved = connect(redis_url, redis_prefix, retry_for=5)
    assert moved.setting("options")["w_rows"] == 5 and moved.setting("options")["epsilon"] == 0.3
    version, params = moved.load_params()
    assert version == 3 and params["w"].shape == (5, 2) and int(params["updates"][0]) == 4
    after = run_cli(FAKE, "eval", "-n", "3", "--seed", "7", "--no-record", "--db", redis_url, "--prefix", redis_prefix)
    assert returns(after.stdout) == before

    # no database at all: the file alone, in a folder with no tinyverse.db
    alone = run_cli(FAKE, "eval", "-n", "3", "--seed", "7", "--no-record", "--params", tmp_path / "agent.safetensors",
                    cwd=tmp_path / "..")  # fmt: skip
    assert returns(alone.stdout) == before

    # a player and a trainer carry on from the imported params: versions go on growing from 3
    run_cli(FAKE, "play", "-n", "2", "-q", "--db", redis_url, "--prefix", redis_prefix)
    run_cli(FAKE, "train", "-n", "2", "-s", "1", "-q", "--db", redis_url, "--prefix", redis_prefix)
    version, params = moved.load_params()
    assert version == 5 and int(params["updates"][0]) == 6, "the trainer resumed from the imported params"
    moved.close()


def test_refusals_are_one_line_and_change_nothing(tmp_path):
    sqlite = f"sqlite:///{tmp_path / 'run.db'}"
    run_cli(FAKE, "play", "-n", "1", "-q", "--db", sqlite, "--set", "w_rows=5")
    agent = tmp_path / "agent.safetensors"
    run_cli(FAKE, "export", "-o", agent, "--db", sqlite)

    def refused(*args, says):  # in tmp_path: a default or partial file would be written there
        proc = run_cli(FAKE, *args, cwd=tmp_path, check=False)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and says in lines[0], proc.stderr
        return lines[0]

    other = f"sqlite:///{tmp_path / 'other.db'}"
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file at all")
    refused("import", tmp_path / "junk.safetensors", "--db", other, says="is not a safetensors file")
    refused("eval", "--params", tmp_path / "missing.safetensors", says="no file")
    safetensors = optional("safetensors.numpy")
    safetensors.save_file({"w": np.zeros((5, 2), np.float32)}, tmp_path / "foreign.safetensors")
    refused("import", tmp_path / "foreign.safetensors", "--db", other, says="holds no tinyverse params")
    refused("eval", "--params", agent, "--set", "w_rows=4", "--no-record", says="w: stored float32[5, 2]")
    refused("import", agent, "--db", sqlite, says="holds params already (version 1)")
    run_cli(FAKE, "play", "-n", "1", "-q", "--db", other, "--set", "w_rows=4")
    refused("import", agent, "--db", other, says="has option w_rows=5, prefix fake_experiment stores w_rows=4")
    refused("export", "--db", other, "--prefix", "nothing-here", says="no params in prefix nothing-here")
    kept = connect(other, "fake_experiment", retry_for=5)
    assert kept.setting("options")["w_rows"] == 4 and kept.params_version() == 1, "a refused import changed nothing"
    kept.close()
    left = [p.name for p in tmp_path.iterdir() if p.name.startswith(".") or p.name == "fake_experiment.safetensors"]
    assert left == [], "no partial file, and no file of the refused export, is left"


def test_the_file_loads_without_tinyverse(tmp_path):
    """The lines docs/usage.rst shows: safetensors + torch load an exported cartpole_dqn agent into a torch net."""
    torch = optional("torch")
    sqlite = f"sqlite:///{tmp_path / 'run.db'}"
    example = ROOT / "examples" / "cartpole_dqn.py"
    run_cli(example, "play", "-n", "1", "-q", "--db", sqlite, "--seed", "0")
    run_cli(example, "export", "-o", tmp_path / "agent.safetensors", "--db", sqlite)
    docs = (ROOT / "docs" / "usage.rst").read_text()
    block = docs.split(".. code-block:: python", 1)[1].split("\nGuarantees", 1)[0]
    lines = [line[4:] for line in block.splitlines() if line.startswith("    ") and "action =" not in line]
    snippet = 'import sys\nsys.modules["tinyverse"] = None  # not reachable\n' + "\n".join(lines)
    snippet += "\nprint(net(torch.ones(1, 4)).tolist())"
    out = subprocess.run([sys.executable, "-c", snippet], cwd=tmp_path, capture_output=True, text=True, check=True)
    from tinyverse import load_experiment

    exp = load_experiment(str(example), connect(sqlite, "cartpole_dqn", retry_for=5))
    exp.set_params(connect(sqlite, "cartpole_dqn", retry_for=5).load_params()[1])
    with torch.no_grad():
        expected = exp.q(torch.ones(1, 4)).tolist()
    assert np.allclose(ast.literal_eval(out.stdout), expected)


def test_an_export_that_cannot_write_says_so_in_one_line_and_leaves_no_part(tmp_path):
    sqlite = f"sqlite:///{tmp_path / 'run.db'}"
    run_cli(FAKE, "play", "-n", "1", "-q", "--db", sqlite)
    (tmp_path / "fake_experiment.safetensors").mkdir()  # the default name is a folder: found at the write only
    proc = run_cli(FAKE, "export", "--db", sqlite, cwd=tmp_path, check=False)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1 and "cannot write fake_experiment.safetensors" in lines[0]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == [], "the partial file went"
    assert list((tmp_path / "fake_experiment.safetensors").iterdir()) == []


MALFORMED = {  # metadata of a file export wrote, changed: each is one line, and nothing is imported
    "options not JSON": ({"options": "{w_rows: 5"}, "options that are no JSON object"),
    "options not an object": ({"options": "[5]"}, "options that are no JSON object"),
    "version not a number": ({"version": "v3"}, "params version 'v3'"),
    "version a superscript digit": ({"version": "\u00b2"}, "params version '\u00b2'"),
    "version negative": ({"version": "-3"}, "params version '-3'"),
    "version past SQLite's integers": ({"version": str(2**63)}, f"params version '{2**63}'"),
}


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[dict, dict]:
    """The params and metadata of a file the real export wrote."""
    optional("safetensors.numpy")
    from safetensors import safe_open

    folder = tmp_path_factory.mktemp("exported")
    sqlite = f"sqlite:///{folder / 'run.db'}"
    run_cli(FAKE, "play", "-n", "1", "-q", "--db", sqlite)
    run_cli(FAKE, "export", "-o", folder / "agent.safetensors", "--db", sqlite)
    with safe_open(folder / "agent.safetensors", framework="np") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()


@pytest.mark.parametrize("case", MALFORMED)
def test_a_file_with_malformed_metadata_is_refused_in_one_line(case, exported, tmp_path, monkeypatch, capsys):
    params, meta = exported
    changed, says = MALFORMED[case]
    agent, other = tmp_path / "agent.safetensors", f"sqlite:///{tmp_path / 'other.db'}"
    optional("safetensors.numpy").save_file(params, agent, metadata={**meta, **changed})
    monkeypatch.chdir(tmp_path)
    for mode in (["import", agent, "--db", other], ["eval", "--params", agent, "--no-record"]):
        assert main([str(FAKE), *map(str, mode)]) == 1
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and says in lines[0], lines
    kept = connect(other, "fake_experiment", retry_for=5, create=False)
    assert kept.params_version() is None and kept.setting("options") is None
    kept.close()


EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.py") if "def make_experiment" in p.read_text())
SHORT = {"atari.py": {"max_episode_steps": 30}, "racing.py": {"max_episode_steps": 30}}  # eval: 30 steps, not a game


@pytest.mark.parametrize("example", EXAMPLES)
def test_every_examples_agent_goes_through_export_import_and_eval(example, tmp_path, monkeypatch, capsys):
    """The README's path: export from one database, import into another, eval the file; 0-d arrays stay 0-d."""
    optional("safetensors.numpy")
    monkeypatch.chdir(tmp_path)
    path, name = str(ROOT / "examples" / example), example.removesuffix(".py")
    first, second = f"sqlite:///{tmp_path / 'first.db'}", f"sqlite:///{tmp_path / 'second.db'}"
    if main([path, "play", "-b", "1", "-n", "1", "-q", "--db", first, *sets(**SHORT.get(example, {}))]):
        err = capsys.readouterr().err
        if "pip install" in err and not IN_CI:  # its extra is not installed here (CI installs every extra)
            pytest.skip(err.strip())
        raise AssertionError(err)
    assert main([path, "export", "-o", "agent.safetensors", "--db", first]) == 0, capsys.readouterr().err
    assert main([path, "import", "agent.safetensors", "--db", second]) == 0, capsys.readouterr().err
    assert main([path, "eval", "-n", "1", "--no-record", "--params", "agent.safetensors"]) == 0
    assert "mean return" in capsys.readouterr().out
    (version, exported), (again, imported) = [connect(url, name).load_params() for url in (first, second)]
    assert again == version and exported.keys() == imported.keys()
    for key, array in exported.items():
        assert imported[key].shape == array.shape and imported[key].dtype == array.dtype, key
        np.testing.assert_array_equal(imported[key], array)
