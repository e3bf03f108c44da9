"""What tinyverse reads from a command line: database URLs and ``--set`` texts, for any text, either a value it
uses as written or one TinyverseError; and a URL it prints shows no secret in any form (Hypothesis)."""

import argparse
import dataclasses
from urllib.parse import quote, unquote_plus, urlsplit

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from tinyverse.database import split_replica, url_from
from tinyverse.errors import SECRET, TinyverseError, masked
from tinyverse.loader import parse_set, typed

SOME = settings(max_examples=200, deadline=None)

# pieces of URLs: random text alone seldom gets past the scheme
TOKENS = ["redis://", "rediss://", "unix://", "sqlite:///", "localhost", "127.0.0.1", "[::1]", ":6379", ":0", ":99999"]
TOKENS += ["/0", "/15", "/1x", "/", "?", "&", "=", "@", ":", "#", "%40", "%2F", "+", "db=", "db=3", "password="]
TOKENS += ["ssl_password=", "Auth_Token=", "pass%77ord=", "username=", "replica=", "replica=h:1", "socket_timeout="]
TOKENS += ["socket_timeout=0.5", "health_check_interval=", "ssl_ca_certs=", "x.db", "hunter2", "tok", "\t", "\x00"]
TOKENS += ["?password=hunter2", "&Auth_Token=tok3n", "?pass%77ord=s3cret", ":hunter2@", "tok3n@", "%3Fhunter2%23"]
PIECE = st.one_of(st.sampled_from(TOKENS), st.text(max_size=4))
SCHEME = st.sampled_from(["redis://", "rediss://", "unix://", "sqlite:///", "mysql://", "REDIS://", ""])
URL_TEXT = st.builds(lambda scheme, pieces: scheme + "".join(pieces), SCHEME, st.lists(PIECE, max_size=10))


def secrets_in(text: str) -> list[str]:
    """Every secret redis-py would read from ``text`` (which parses as urlsplit does), raw and decoded."""
    try:
        parts = urlsplit(text)
        found = [parts.username if parts.password is None else parts.password]
    except ValueError:  # an unclosed [IPv6: nothing is read
        return []
    for item in parts.query.split("&"):
        name, _, value = item.partition("=")
        if SECRET.search(unquote_plus(name)):
            found.append(value)
    return [s for s in {*found, *(unquote_plus(s) for s in found if s)} if s]


def assert_hidden(text: str, shown: str) -> None:
    """No secret of ``text`` in ``shown`` (but one also elsewhere in the text, the host say, may show there)."""
    for secret in secrets_in(text):
        if len(secret) >= 3 and "*" not in secret and text.count(secret) == 1:
            assert secret not in shown, (text, shown, secret)


@SOME
@given(URL_TEXT)
def test_masked_never_shows_a_secret_redis_would_read(text):
    assert_hidden(text, masked(text))


def password_slots(user: str | None, secret_name: str):
    """A URL with the secret in the userinfo and in the query, percent-encoded as a URL must hold it."""
    return lambda secret: (
        f"redis://{'' if user is None else user}:{quote(secret, safe='')}@db.example:6380/2"
        f"?client_name=me&{secret_name}={quote(secret, safe='')}"
    )


SECRET_NAMES = st.sampled_from(["password", "ssl_password", "Auth_Token", "my_secret", "PASSWORD", "pass%77ord"])


@SOME
@given(st.text(min_size=1), st.text(min_size=1), st.none() | st.sampled_from(["alice", "tinyverse"]), SECRET_NAMES)
def test_masked_output_does_not_depend_on_the_secret(one, other, user, name):
    url = password_slots(user, name)
    assert (
        masked(url(one))
        == masked(url(other))
        == (f"redis://{'' if user is None else user}:***@db.example:6380/2?client_name=me&{name}=***")
    )


@SOME
@given(st.text(min_size=1), st.text(min_size=1))
def test_a_userinfo_without_a_password_is_masked_whole(one, other):
    url = "rediss://{}@db.example:6380/0?ssl_ca_certs=%2Fetc%2Fca.pem".format
    assert masked(url(quote(one, safe=""))) == masked(url(quote(other, safe=""))) == url("***")


@SOME
@given(URL_TEXT)
def test_url_parsing_gives_a_url_the_backend_reads_or_one_error(text):
    try:
        url = url_from(text)
    except TinyverseError as e:
        assert "\n" not in str(e)
        assert_hidden(text, str(e))
        return
    if url.startswith("sqlite://"):
        return
    index = urlsplit(url).path.strip("/")
    if not url.startswith("unix://") and index:  # the DB the URL names, not a silent 0 (redis-py reads /1x as 0)
        assert redis.connection.parse_url(url)["db"] == int(index)
    try:
        for each in filter(None, split_replica(url)):  # what RedisDatabase does before connecting
            redis.ConnectionPool.from_url(each).make_connection()
    except TinyverseError:
        pass
    except redis.RedisError:  # e.g. an unknown ssl_cert_reqs: the backend's first call says it in one line
        pass


@dataclasses.dataclass
class Args:
    flag: bool = False
    count: int = 3
    rate: float = 0.5
    name: str = "x"
    limit: int | None = None
    scale: float | None = 1.0


KINDS = {"flag": bool, "count": int, "rate": float, "name": str, "limit": int, "scale": float}
SET_TEXT = st.one_of(
    st.text(max_size=20),
    st.builds(lambda n, v: f"{n}={v}", st.sampled_from([*KINDS, "other", " count "]), st.text(max_size=12)),
    st.builds(lambda n, v: f"{n}={v}", st.sampled_from(list(KINDS)), st.sampled_from(["1", "-2", "1e400", "nan",
              "none", "None", "yes", "off", "0x10", "1_000", "٣", "²", "9" * 5000, " 7 ", "true", ""])),
)  # fmt: skip


@SOME
@given(SET_TEXT)
def test_a_set_text_gives_a_value_of_the_fields_type_or_one_error(text):
    try:
        name, value = parse_set(text)
    except argparse.ArgumentTypeError:
        assert "=" not in text
        return
    try:
        found = typed(Args, "experiment.py", {name: value})
    except TinyverseError as e:
        assert "\n" not in str(e)
        return
    optional_field = name in ("limit", "scale")
    assert type(found[name]) is KINDS[name] or (optional_field and found[name] is None), (text, found)


# -- examples: what each check says ------------------------------------------------------------------------------------
REFUSED = {
    "port 0": ("redis://h:0/0", "port 0"),
    "port past 65535": ("redis://h:99999/0", "out of range"),
    "port not a number": ("redis://h:abc/0", "'abc'"),
    "DB index 1x": ("redis://h:6379/1x", "DB index '1x'"),
    "DB index twice": ("redis://h:6379/1?db=2", "db given twice"),
    "password twice": ("redis://:pw@h:6379/0?password=pw2", "password given twice"),
    "unknown query item": ("redis://h:6379/0?decode_responses=1", "unknown query item 'decode_responses'"),
    "TLS item without TLS": ("redis://h:6379/0?ssl_ca_certs=/ca.pem", "unknown query item 'ssl_ca_certs'"),
    "a timeout of 0": ("redis://h/0?socket_timeout=0", "want seconds"),
    "an unencoded / in a password": ("redis://:pa/ss@h:6379/0", "percent-encode"),
    "a fragment": ("redis://h:6379/0#x", "percent-encode"),
    "an unclosed IPv6": ("redis://[::1/0", "IPv6"),
    "a unix socket without a path": ("unix://", "no socket"),
    "a sqlite query": ("sqlite:///x.db?mode=ro", "no ? or #"),
    "a control character": ("redis://h\n:6379/0", "unknown database URL"),
    "an unknown scheme": ("mysql://u:pw@h/x", "unknown database URL 'mysql://u:***@h/x'"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_a_url_the_backend_would_misread_is_refused_in_one_line(case):
    url, says = REFUSED[case]
    with pytest.raises(TinyverseError) as refused:
        url_from(url)
    assert says in str(refused.value) and "\n" not in str(refused.value)
    assert "pw2" not in str(refused.value) and ":pw@" not in str(refused.value)


def test_a_sqlite_url_naming_a_folder_is_refused(tmp_path):
    with pytest.raises(TinyverseError, match="want a file's path"):
        url_from(f"sqlite:///{tmp_path}")


def test_the_server_flags_build_a_url_and_override_tinyverse_db(monkeypatch):
    monkeypatch.setenv("TINYVERSE_DB", "redis://elsewhere:6379/3")
    assert url_from(None) == "redis://elsewhere:6379/3"
    assert url_from(None, port=6380, password="p@ss/word") == "redis://:p%40ss%2Fword@localhost:6380/0"
    assert url_from(None, host="::1") == "redis://[::1]:6379/0"
    for flags, says in (({"port": 6380}, "--db and --port"), ({"password": "x"}, "--db and --password")):
        with pytest.raises(TinyverseError, match=says):
            url_from("redis://h:6379/11", **flags)
    for flags, says in (({"host": "h:6380"}, "--host 'h:6380'"), ({"password": ""}, "--password is empty")):
        with pytest.raises(TinyverseError, match=says):
            url_from(None, **flags)


MASKED = {
    "redis://:tok@h:6379/0": "redis://:***@h:6379/0",
    "redis://tok@h:6379/0": "redis://***@h:6379/0",
    "redis://alice:pw@h:6379/0": "redis://alice:***@h:6379/0",
    "redis://h:6379/0?password=pw&db=1": "redis://h:6379/0?password=***&db=1",
    "rediss://h/0?ssl_password=pw&ssl_ca_certs=%2Fca.pem": "rediss://h/0?ssl_password=***&ssl_ca_certs=%2Fca.pem",
    "redis://h/0?pass%77ord=pw": "redis://h/0?pass%77ord=***",
    "redis://h/0?PASSWORD=pw#frag": "redis://h/0?PASSWORD=***#***",
    "redis://h/0?password=a@b": "redis://***",
    "redis://:p/w@h/0": "redis://***",
    "sqlite:///runs/x.db": "sqlite:///runs/x.db",
}


@pytest.mark.parametrize("url", MASKED)
def test_masked_hides_every_form_of_a_secret(url):
    assert masked(url) == MASKED[url]
