# SPDX-License-Identifier: ISC
"""query_set_var / query_on_vars / query_vars_inline (plugin ABI 1.5, 1.7)
with the test plugin t_vars: the values a plugin asks for reach the server
(quotes doubled, the longest values, several per statement, the set_config
form for names SET cannot take as written, non-ASCII values), the core
knows which values a server has, forgets them when told, and refuses what
the API refuses. The statement itself reads the values with current_setting()."""

import os

import pytest

from lokadb_harness import HERE, Wire, message

PLUGIN_DIR = os.environ.get("LOKADB_TEST_PLUGIN_DIR") or str(
    (HERE / "../../build/rel/test-plugins").resolve())

SENT, KNOWN, SKIPPED = 1, 0, -1


@pytest.fixture
def b(bouncer_factory):
    return bouncer_factory(settings={"plugin_dir": PLUGIN_DIR, "plugins": "t_vars", "pool_mode": "session"})


def last_vars(b):
    (row,) = b.admin("SHOW T_VARS")
    return int(row[0]), int(row[1]), int(row[2])


def settings(w, items, names, tail=""):
    cols = ", ".join(f"current_setting('{n}', true)" for n in names)
    return tuple(w.query(f"/*vars {'|'.join(items)} */ SELECT {cols}{tail}").rows[0])


def test_values_with_quotes_hidden_then_known_then_inline(b):
    w = b.login()
    assert settings(w, ["t.a=it's", "t.b=@q3"], ["t.a", "t.b"]) == ("it's", "'''")
    assert last_vars(b)[:2] == (SENT, 0b11)
    # the same values again: the server is known to have them
    assert settings(w, ["t.a=it's", "t.b=@q3"], ["t.a", "t.b"]) == ("it's", "'''")
    assert last_vars(b)[:2] == (KNOWN, 0)
    # in front of the Query: only the value that changed goes
    assert settings(w, ["inline", "t.a=o''k", "t.b=@q3"], ["t.a", "t.b"]) == ("o''k", "'''")
    assert last_vars(b)[:2] == (SENT, 0b01)
    assert settings(w, ["t.a=o''k", "t.b=@q3"], ["t.a", "t.b"]) == ("o''k", "'''")
    assert last_vars(b)[:2] == (KNOWN, 0)
    res = w.query("SELECT 1")      # no values: the client sees no trace of the prefixes
    assert [tuple(r) for r in res.rows] == [("1",)] and res.tags == ["SELECT 1"]


def test_several_values_set_config_form_and_non_ascii(b):
    w = b.login()
    names = ["t.a", "t.mixed", "t.c", "t.d"]
    # t.Mixed cannot go in a SET as written, é not inline: one hidden SELECT set_config(...)
    got = settings(w, ["inline", "t.a=1", "t.Mixed=two's", "t.c=@u", "t.d="], names)
    assert got == ("1", "two's", "\u00e9", "")
    assert last_vars(b)[:2] == (SENT, 0b1111)
    got = settings(w, ["t.a=1", "t.Mixed=two's", "t.c=@u", "t.d="], names)
    assert got == ("1", "two's", "\u00e9", "")
    assert last_vars(b)[:2] == (KNOWN, 0)
    # a name given twice keeps its number; the last value wins
    assert settings(w, ["t.a=x", "t.a=y", "t.c=@u"], ["t.a", "t.c"]) == ("y", "\u00e9")
    assert last_vars(b)[:2] == (SENT, 0b01)


def test_the_longest_values_and_what_is_refused(b):
    w = b.login()
    # eight names (the most), each value 255 quotes, in the set_config form: the longest prefix
    names = [f"t.V{i}_" + "x" * (59 - len(str(i))) for i in range(8)]
    assert all(len(n) == 63 for n in names)
    got = settings(w, [f"{n}=@q255" for n in names], [n.lower() for n in names])
    assert got == ("'" * 255,) * 8
    assert last_vars(b)[:2] == (SENT, 0xFF)
    # the same, inline-able names (SET form)
    names = [f"t.v{i}" for i in range(8)]
    got = settings(w, ["inline"] + [f"{n}=@q255" for n in names], names)
    assert got == ("'" * 255,) * 8
    assert last_vars(b)[:2] == (SENT, 0xFF)

    def refused(items, name):
        res = w.query(f"/*vars {'|'.join(items)} */ SELECT 1", raise_error=False)
        assert res.error is not None and res.error.sqlstate == "22023", res.messages
        assert res.error.message == f"t_vars: query_set_var refused {name}"

    refused(["t.long=@a256"], "t.long")
    refused(["t." + "n" * 62 + "=1"], "t." + "n" * 62)
    refused([f"t.w{i}=1" for i in range(9)], "t.w8")
    refused(["t.bs=a\\b"], "t.bs")
    # the client goes on; a value of 255 letters is fine
    assert settings(w, ["t.long=@a255"], ["t.long"]) == ("a" * 255,)


def test_a_value_the_statement_changes_is_forgotten(b):
    w = b.login()
    assert settings(w, ["t.a=1"], ["t.a"]) == ("1",)
    assert last_vars(b)[:2] == (SENT, 1)
    w.query("/*vars t.a */ SET t.a = 'changed'")
    assert last_vars(b)[:2] == (KNOWN, 0)
    assert settings(w, ["t.a=1"], ["t.a"]) == ("1",)
    assert last_vars(b)[:2] == (SENT, 1)


def test_a_failed_inline_statement_leaves_the_value_unknown(b):
    w = b.login()
    res = w.query("/*vars inline|t.a=5 */ SELECT 1/0", raise_error=False)
    assert res.error is not None and res.error.sqlstate == "22012"
    assert last_vars(b)[:2] == (SENT, 1)
    # rolled back with the statement: sent again
    assert settings(w, ["inline", "t.a=5"], ["t.a"]) == ("5",)
    assert last_vars(b)[:2] == (SENT, 1)
    assert settings(w, ["inline", "t.a=5"], ["t.a"]) == ("5",)
    assert last_vars(b)[:2] == (KNOWN, 0)


def test_values_inside_an_extended_protocol_batch(b):
    """Where no simple Query may go (in the middle of a batch, before a Bind
    of the unnamed statement) the values of a statement whose plugin called
    query_vars_inline (ABI 1.9; every statement with ABI 1.8) go as hidden
    extended-protocol messages: the client sees only its own replies, an error
    reaches it as its batch's, and the core takes the values as known once
    the batch's transaction ended (ReadyForQuery I) without an error."""
    w = b.login()
    items = "/*vars inline|t.a=it's|t.Mixed=@q2 */ "
    sql = items + "SELECT current_setting('t.a', true), current_setting('t.mixed', true)"
    one = Wire.bind_msg() + Wire.execute_msg()
    # the second statement of a batch: t.Mixed needs the set_config form
    w.send(Wire.parse_msg("SELECT 1") + one + Wire.parse_msg(sql) + one + Wire.sync_msg())
    res = w.read_until_ready()
    assert res.error is None and res.rows == [["1"], ["it's", "''"]]
    assert [m[0] for m in res.messages] == [b"1", b"2", b"D", b"C"] * 2 + [b"Z"]
    assert last_vars(b)[:2] == (SENT, 0b11)
    # known since the batch's ReadyForQuery: nothing goes
    assert settings(w, ["t.a=it's", "t.Mixed=@q2"], ["t.a", "t.mixed"]) == ("it's", "''")
    assert last_vars(b)[:2] == (KNOWN, 0)
    # only what changed goes, in the batch before its second Parse; known once that
    # batch ended, so a Bind of that unnamed statement alone in the next batch sends nothing
    w.send(Wire.parse_msg("SELECT 1") + one +
           Wire.parse_msg(items.replace("it's", "x") + "SELECT current_setting('t.a', true)") + Wire.sync_msg())
    res = w.read_until_ready()
    assert res.error is None and [m[0] for m in res.messages] == [b"1", b"2", b"D", b"C", b"1", b"Z"]
    assert last_vars(b)[:2] == (SENT, 0b01)
    w.send(one + Wire.sync_msg())
    res = w.read_until_ready()
    assert res.error is None and res.rows == [["x"]] and [m[0] for m in res.messages] == [b"2", b"D", b"C", b"Z"]
    assert last_vars(b)[:2] == (KNOWN, 0)
    # names a SET takes as written: one SET per group of hidden messages
    sql2 = "/*vars inline|t.a=o''k|t.b=@q3 */ SELECT current_setting('t.a', true), current_setting('t.b', true)"
    w.send(Wire.parse_msg("SELECT 1") + one + Wire.parse_msg(sql2) + one + Wire.sync_msg())
    res = w.read_until_ready()
    assert res.error is None and res.rows == [["1"], ["o''k", "'''"]]
    assert [m[0] for m in res.messages] == [b"1", b"2", b"D", b"C"] * 2 + [b"Z"]
    assert last_vars(b)[:2] == (SENT, 0b11)
    # a statement that fails behind the hidden messages: its error, nothing else
    items3 = "/*vars inline|t.a=gone|t.b=@q3 */ "
    w.send(Wire.parse_msg("SELECT 1") + one + Wire.parse_msg(items3 + "SELECT 1 / (count(*) - count(*)) FROM pg_class")
           + one + Wire.sync_msg())
    res = w.read_until_ready()
    assert res.error is not None and res.error.sqlstate == "22012"
    assert [m[0] for m in res.messages] == [b"1", b"2", b"D", b"C", b"1", b"2", b"E", b"Z"]
    assert last_vars(b)[:2] == (SENT, 0b01)
    # rolled back with the batch's implicit transaction, and not taken as known
    assert w.query("SELECT current_setting('t.a', true)").rows == [["o''k"]]
    assert settings(w, ["t.a=gone"], ["t.a"]) == ("gone",)
    assert last_vars(b)[:2] == (SENT, 0b01)
    res = w.query("SELECT 1")
    assert res.rows == [["1"]] and res.tags == ["SELECT 1"]


def test_values_before_a_copy_started_inside_a_batch(b):
    """A COPY FROM STDIN started by an Execute makes PostgreSQL ignore the Sync
    already sent: the values sent in that batch are answered by the Sync the
    client sends after the COPY, and later values are tracked as before."""
    w = b.login()
    w.query("CREATE TEMP TABLE t_copy (x int)")
    one = Wire.bind_msg() + Wire.execute_msg()
    w.send(Wire.parse_msg("SELECT 1") + one + Wire.parse_msg("/*vars inline|t.a=copy */ COPY t_copy FROM STDIN") + one +
           Wire.sync_msg())
    types = []
    while (not types or types[-1] != b"G") and len(types) < 10:
        types.append(w.read_msg()[0])
    assert types == [b"1", b"2", b"D", b"C", b"1", b"2", b"G"]
    assert last_vars(b)[:2] == (SENT, 1)
    w.send(message(b"d", b"7\n") + message(b"c") + Wire.sync_msg())
    res = w.read_until_ready()
    assert res.error is None and res.tags == ["COPY 1"]
    # known since that Sync: nothing goes
    assert settings(w, ["t.a=copy"], ["t.a"]) == ("copy",)
    assert last_vars(b)[:2] == (KNOWN, 0)
    for v in ("h1", "h2", "h3", "h4", "h5"):       # and hidden ones keep being tracked
        assert settings(w, [f"t.a={v}"], ["t.a"]) == (v,)
        assert last_vars(b)[:2] == (SENT, 1)
        assert settings(w, [f"t.a={v}"], ["t.a"]) == (v,)
        assert last_vars(b)[:2] == (KNOWN, 0)
    assert w.query("SELECT count(*) FROM t_copy").rows == [["1"]]


def test_a_reported_setting_sent_inside_a_batch_is_reported_as_in_front_of_a_query(b):
    """PostgreSQL reports a changed setting it reports to clients (ParameterStatus
    of application_name) with the ReadyForQuery that ends the transaction, which
    is the client's: a value sent inside a batch is reported there, as one sent
    in front of a Query is; only a hidden Query of its own keeps it away."""
    w = b.login()
    one = Wire.bind_msg() + Wire.execute_msg()
    w.send(Wire.parse_msg("SELECT 1") + one +
           Wire.parse_msg("/*vars inline|application_name=from_batch */ SELECT current_setting('application_name')") + one +
           Wire.sync_msg())
    res = w.read_until_ready()
    assert res.error is None and res.rows == [["1"], ["from_batch"]]
    assert [m[0] for m in res.messages] == [b"1", b"2", b"D", b"C"] * 2 + [b"S", b"Z"]
    assert w.params["application_name"] == "from_batch"
    res = w.query("/*vars inline|application_name=from_inline */ SELECT current_setting('application_name')")
    assert res.rows == [["from_inline"]] and [m[0] for m in res.messages] == [b"T", b"D", b"C", b"S", b"Z"]
    res = w.query("/*vars application_name=from_hidden */ SELECT current_setting('application_name')")
    assert res.rows == [["from_hidden"]] and [m[0] for m in res.messages] == [b"T", b"D", b"C", b"Z"]


def test_values_in_front_of_a_batch_go_inside_it_and_follow_its_transaction(b):
    """Before the first message of a batch (a Parse, or a Bind of a named
    statement) whose plugin called query_vars_inline (ABI 1.9), the values go
    as hidden extended-protocol messages in front of it, which cost
    PostgreSQL less than a Query of their own: the client sees only its
    replies, and the values follow the batch's implicit transaction (rolled
    back when its statement fails). Without query_vars_inline (a statement
    such as VACUUM, which PostgreSQL refuses behind other messages of a
    batch) they go as a hidden Query of their own, which stays set."""
    w = b.login()
    one = Wire.bind_msg() + Wire.execute_msg()
    w.send(Wire.parse_msg("/*vars inline|t.a=first */ SELECT current_setting('t.a', true)") + one +
           Wire.sync_msg())
    res = w.read_until_ready()
    assert res.error is None and res.rows == [["first"]]
    assert [m[0] for m in res.messages] == [b"1", b"2", b"D", b"C", b"Z"]
    assert last_vars(b)[:2] == (SENT, 1)
    # a failing statement behind them: its error alone, and the value rolled back
    w.send(Wire.parse_msg("/*vars inline|t.a=rolled_back */ SELECT 1 / (count(*) - count(*)) FROM pg_class") +
           one + Wire.sync_msg())
    res = w.read_until_ready()
    assert res.error is not None and res.error.sqlstate == "22012"
    assert [m[0] for m in res.messages] == [b"1", b"2", b"E", b"Z"]
    assert last_vars(b)[:2] == (SENT, 1)
    assert w.query("SELECT current_setting('t.a', true)").rows == [["first"]]
    # a Bind of a named statement first in its batch: the same
    w.send(Wire.parse_msg("/*vars inline|t.a=bound */ SELECT current_setting('t.a', true)", name="s2") +
           Wire.sync_msg())
    assert w.read_until_ready().error is None
    assert w.query("/*vars t.a */ SELECT set_config('t.a', 'other', false)").rows == [["other"]]
    w.send(Wire.bind_msg(stmt="s2") + Wire.execute_msg() + Wire.sync_msg())
    res = w.read_until_ready()
    assert res.error is None and res.rows == [["bound"]]
    assert [m[0] for m in res.messages] == [b"2", b"D", b"C", b"Z"]
    assert last_vars(b)[:2] == (SENT, 1)
    w.send(Wire.bind_msg(stmt="s2") + Wire.execute_msg() + Wire.sync_msg())
    assert w.read_until_ready().rows == [["bound"]]
    assert last_vars(b)[:2] == (KNOWN, 0)
    # without query_vars_inline: a hidden Query of its own, set whatever the statement does
    w.send(Wire.parse_msg("/*vars t.a=own_query */ SELECT 1 / (count(*) - count(*)) FROM pg_class") + one +
           Wire.sync_msg())
    res = w.read_until_ready()
    assert res.error is not None and res.error.sqlstate == "22012"
    assert [m[0] for m in res.messages] == [b"1", b"2", b"E", b"Z"]
    assert w.query("SELECT current_setting('t.a', true)").rows == [["own_query"]]
    # VACUUM: before its Parse a Query of its own; before its Bind, inside the
    # batch, nothing (PostgreSQL would refuse it behind the values' Execute)
    w.send(Wire.parse_msg("/*vars t.a=vacuum */ VACUUM pg_class") + one + Wire.sync_msg())
    res = w.read_until_ready()
    assert res.error is None and res.tags == ["VACUUM"]
    assert last_vars(b)[:2] == (SKIPPED, 0)
    assert w.query("SELECT current_setting('t.a', true)").rows == [["vacuum"]]
    w.send(Wire.parse_msg("/*vars t.a=vacuum2 */ VACUUM pg_class", name="v") + Wire.sync_msg())
    assert w.read_until_ready().error is None
    w.send(Wire.bind_msg(stmt="v") + Wire.execute_msg() + Wire.sync_msg())
    res = w.read_until_ready()
    assert res.error is None and res.tags == ["VACUUM"]


def test_values_a_rollback_in_their_batch_undid_are_not_taken_as_known(b):
    """Values sent inside a batch are known once the batch's ReadyForQuery says
    idle without an error, unless a ROLLBACK in that batch (also to a
    savepoint, then COMMIT) undid them."""
    w = b.login()
    one = Wire.bind_msg() + Wire.execute_msg()
    assert settings(w, ["t.a=before"], ["t.a"]) == ("before",)
    for ends in (["ROLLBACK"], ["ROLLBACK TO SAVEPOINT s", "COMMIT"]):
        w.query("BEGIN")
        w.query("SAVEPOINT s")
        w.send(Wire.parse_msg("/*vars inline|t.a=undone */ SELECT current_setting('t.a', true)") + one +
               b"".join(Wire.parse_msg(e) + one for e in ends) + Wire.sync_msg())
        res = w.read_until_ready()
        assert res.error is None and res.rows == [["undone"]]
        assert res.tags[-1] == ("ROLLBACK" if len(ends) == 1 else "COMMIT")
        assert w.query("SELECT current_setting('t.a', true)").rows == [["before"]]
        # not known: it goes again, and the statement sees it
        assert settings(w, ["t.a=undone"], ["t.a"]) == ("undone",)
        assert last_vars(b)[:2] == (SENT, 1)
        assert settings(w, ["t.a=before"], ["t.a"]) == ("before",)
