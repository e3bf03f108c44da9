"""The workbench notebook runs top to bottom, and its committed file carries no outputs."""

import subprocess
import sys
import time
from pathlib import Path

from conftest import optional

import tinyverse

nbformat = optional("nbformat")
NotebookClient = optional("nbclient").NotebookClient

NOTEBOOK = Path(__file__).resolve().parents[1] / "workbench.ipynb"
STRIP = (  # how to strip a notebook saved with its outputs
    "python -c \"import nbformat as n; nb = n.read('workbench.ipynb', 4); "
    "[c.update(outputs=[], execution_count=None) for c in nb.cells if c.cell_type == 'code']; "
    "n.write(nb, 'workbench.ipynb')\""
)
SECONDS = "20"  # training time in the test: enough for sessions, updates and a published params version


def test_the_committed_notebook_has_no_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, "no code cells"
    assert [c.outputs for c in code] == [[]] * len(code), f"strip the outputs before committing: {STRIP}"
    assert all(c.execution_count is None for c in code), f"strip the execution counts before committing: {STRIP}"


def text_of(cell) -> str:
    """What a cell printed, and the tracebacks of errors."""
    parts = [o.text for o in cell.outputs if o.output_type == "stream"]
    return "".join(parts + ["\n".join(o.traceback) for o in cell.outputs if o.output_type == "error"])


def test_the_notebook_runs_top_to_bottom(tmp_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_SECONDS", SECONDS)
    monkeypatch.setenv("WORKBENCH_DIR", str(tmp_path))
    monkeypatch.delenv("TINYVERSE_DB", raising=False)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    began = time.monotonic()
    try:
        client.execute()
    finally:  # whatever failed, no worker outlives the test
        url = f"sqlite:///{tmp_path / 'workbench.db'}"
        if (tmp_path / "workbench.db").exists():
            subprocess.run([sys.executable, "-m", "tinyverse", "clear", "--all", "--db", url], capture_output=True)
    took = time.monotonic() - began
    print(f"the notebook ran in {took:.0f} s")
    code = [c for c in nb.cells if c.cell_type == "code"]
    everything = "\n".join(text_of(c) for c in code)
    assert "Traceback" not in everything and "tinyverse: error" not in everything, everything

    # the experiment was written and trained: sessions, updates, published params
    assert (tmp_path / "tiny_dqn.py").is_file()
    watch = next(c for c in code if "view.update(fig)" in c.source)
    images = [o for o in watch.outputs if o.output_type == "display_data" and "image/png" in o.data]
    assert images, "the return curve is shown"
    title = text_of(watch).strip().splitlines()[-1]  # "N episodes, params version V, S s"
    episodes, version = int(title.split()[0]), title.split("params version ")[1].split(",")[0]
    assert episodes > 0 and version != "None" and int(version) >= 1, title

    # both workers stopped warm (SIGINT: exit code 0), the trainer after publishing
    stop = next(c for c in code if "stop_workers()" in c.source and "proc.wait" in c.source)
    assert "play exited with code 0" in text_of(stop) and "train exited with code 0" in text_of(stop), text_of(stop)

    # eval wrote a video and the notebook embeds it
    evaluation = next(c for c in code if '"eval"' in c.source)
    assert "mean return" in text_of(evaluation)
    assert list((tmp_path / "records").glob("*.mp4"))
    html = [o.data.get("text/html", "") for o in evaluation.outputs if o.output_type == "display_data"]
    assert any("<video" in h and "base64" in h for h in html), "the video is embedded"

    # info read the namespace; clear emptied it
    info = next(c for c in code if '"info"' in c.source)
    assert "[tiny_dqn]" in text_of(info) and "sessions" in text_of(info) and "returns" in text_of(info)
    cleared = next(c for c in code if '"clear"' in c.source)
    assert "sessions stored: 0 - params: None" in text_of(cleared), text_of(cleared)
    db = tinyverse.connect(f"sqlite:///{tmp_path / 'workbench.db'}", "tiny_dqn", retry_for=5, create=False)
    assert db.count_sessions() == (0, 0) and db.params_version() is None and db.workers() == []
    db.close()
