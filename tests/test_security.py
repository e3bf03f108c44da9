"""Redis on an open network: ACL users, TLS, and secrets that never show, against real redis-servers."""

import json
import shutil
import subprocess
import sys
import time

import pytest
import redis
from conftest import ROOT, _missing, cli_env, free_port, run_cli, wait_for

from tinyverse.database import connect
from tinyverse.errors import DatabaseError

FAKE = ROOT / "tests" / "fake_experiment.py"
SECRET = "s3cret-Pa55"


def start_server(tmp_path, *args, client: dict) -> subprocess.Popen:
    """A private redis-server with ``args``, once ``client`` (redis.Redis kwargs) gets a PONG."""
    if shutil.which("redis-server") is None:
        _missing("redis-server is not installed: apt-get install redis-server")
    cmd = ["redis-server", "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", *args]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            redis.Redis(host="127.0.0.1", socket_connect_timeout=0.5, **client).ping()
            return proc
        except redis.RedisError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"redis-server {' '.join(args)} did not start")


def stop(proc):
    proc.kill()
    proc.wait()


@pytest.fixture
def acl_redis(tmp_path):
    """A server whose only user is alice (the default user is off): redis://alice:SECRET@..."""
    port = free_port()
    users = ["--user", "default", "off", "--user", "alice", "on", f">{SECRET}", "~*", "&*", "+@all"]
    proc = start_server(tmp_path, "--port", str(port), *users, client={"port": port, "username": "alice",
                                                                        "password": SECRET})  # fmt: skip
    yield port
    stop(proc)


def certificates(where, name):
    """A CA and a server certificate for 127.0.0.1 signed by it, made with openssl."""
    if shutil.which("openssl") is None:
        _missing("openssl is not installed: it makes the test certificates")

    def openssl(*args):
        subprocess.run(["openssl", *args], cwd=where, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}-ca.key", "-out", f"{name}-ca.crt",
            "-days", "2", "-subj", f"/CN={name} test CA")  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj",
            "/CN=127.0.0.1")  # fmt: skip
    (where / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{name}-ca.crt", "-CAkey", f"{name}-ca.key",
            "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", "san.cnf")  # fmt: skip
    return where / f"{name}-ca.crt", where / f"{name}.crt", where / f"{name}.key"


@pytest.fixture
def tls_redis(tmp_path):
    """A server that speaks TLS only, with a password: (port, the CA file that verifies it)."""
    ca, cert, key = certificates(tmp_path, "server")
    port = free_port()
    tls = ["--port", "0", "--tls-port", str(port), "--tls-cert-file", str(cert), "--tls-key-file", str(key)]
    tls += ["--tls-ca-cert-file", str(ca), "--tls-auth-clients", "no", "--requirepass", SECRET]
    proc = start_server(tmp_path, *tls, client={"port": port, "ssl": True, "ssl_ca_certs": str(ca),
                                                 "password": SECRET})  # fmt: skip
    yield port, ca
    stop(proc)


def test_an_acl_user_works_and_its_password_is_masked(acl_redis, tmp_path, caplog):
    url = f"redis://alice:{SECRET}@127.0.0.1:{acl_redis}/0"
    db = connect(url, "fake_experiment", retry_for=5)
    assert db.url == f"redis://alice:***@127.0.0.1:{acl_redis}/0"
    out = run_cli(FAKE, "play", "-n", "3", "--db", url, cwd=tmp_path)
    assert db.count_sessions()[0] == 6  # the fake plays 2 environments: 3 rounds
    info = run_cli(FAKE, "info", "--db", url, cwd=tmp_path).stdout
    assert f"redis://alice:***@127.0.0.1:{acl_redis}/0" in info
    assert SECRET not in out.stdout + out.stderr + info + caplog.text


@pytest.mark.parametrize("user", ["alice", "bob"])
def test_a_wrong_acl_password_or_user_is_one_line_at_once(acl_redis, tmp_path, user):
    url = f"redis://{user}:wrong@127.0.0.1:{acl_redis}/0"
    started = time.monotonic()
    proc = run_cli(FAKE, "play", "--db", url, cwd=tmp_path, check=False, timeout=30)
    assert time.monotonic() - started < 20, "a refused password was waited on"
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr
    assert "refused the password" in lines[0] and f"{user}:***@" in lines[0] and "wrong" not in lines[0]


def test_tls_with_the_right_ca_trains_and_plays(tls_redis, tmp_path):
    port, ca = tls_redis
    where = ["--host", "127.0.0.1", "--port", str(port), "--password", SECRET, "--tls-ca", str(ca)]
    run_cli(FAKE, "play", "-n", "4", *where, cwd=tmp_path)
    run_cli(FAKE, "train", "-n", "5", "-b", "4", *where, cwd=tmp_path)
    db = connect(f"rediss://:{SECRET}@127.0.0.1:{port}/0?ssl_ca_certs={ca}", "fake_experiment", retry_for=5)
    assert db.count_sessions()[0] == 8 and int(db.load_params()[1]["updates"][0]) == 5
    info = run_cli(FAKE, "info", *where, cwd=tmp_path).stdout
    assert f"rediss://:***@127.0.0.1:{port}/0" in info and SECRET not in info


def test_tls_with_another_ca_is_one_line_at_once(tls_redis, tmp_path):
    port, _ = tls_redis
    other, _, _ = certificates(tmp_path, "other")
    url = f"rediss://:{SECRET}@127.0.0.1:{port}/0?ssl_ca_certs={other}"
    with pytest.raises(DatabaseError) as error:
        connect(url, "tls", retry_for=None)  # None waits for ever on an outage: this is not one
    message = str(error.value)
    assert "TLS with Redis at rediss://:***@" in message and "certificate verify failed" in message
    assert "--tls-ca" in message and SECRET not in message and "\n" not in message
    proc = run_cli(FAKE, "info", "--db", url, cwd=tmp_path, check=False, timeout=30)
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    missing = run_cli(FAKE, "info", "--port", str(port), "--tls-ca", "nope.pem", cwd=tmp_path, check=False)
    assert missing.returncode == 1 and "--tls-ca nope.pem: want the CA certificate file" in missing.stderr


def logged(path) -> bool:
    """Whether a player's log holds its first lines (its progress, or its params)."""
    text = path.read_text()
    return "env steps" in text or "params" in text


def test_secrets_stay_out_of_heartbeats_logs_and_process_lists(acl_redis, tmp_path):
    url = f"redis://alice:{SECRET}@127.0.0.1:{acl_redis}/0"
    env_url = {"TINYVERSE_DB": url}  # the way docs say to pass a password: not on the command line
    log = open(tmp_path / "player.log", "w")
    player = subprocess.Popen(
        [sys.executable, "-m", "tinyverse", str(FAKE), "play", "-v"], cwd=tmp_path, stdout=log,
        stderr=subprocess.STDOUT, env=cli_env(**env_url),
    )  # fmt: skip
    try:
        db = connect(url, "fake_experiment", retry_for=5)
        deadline = time.monotonic() + 60
        while not db.workers() and time.monotonic() < deadline:
            time.sleep(0.1)
        beats = json.dumps(db.workers())
        assert '"role": "player"' in beats and SECRET not in beats
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        assert SECRET not in ps
        wait_for(lambda: logged(tmp_path / "player.log"), 60, "the player's first lines")  # it may beat before it logs
    finally:
        player.terminate()
        player.wait(30)
        log.close()
    text = (tmp_path / "player.log").read_text()
    assert "env steps" in text or "params" in text, text  # it did log
    assert SECRET not in text
