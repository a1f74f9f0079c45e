"""The documentation matches the binary: doc/config.md is what
`lokadb --describe-config` prints, so every setting in the table is documented."""
import os
import subprocess

from lokadb_harness import default_bin

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_doc_config_md_is_generated_from_the_settings_table():
    out = subprocess.run([default_bin(), "--describe-config"], capture_output=True, text=True,
                         timeout=10, check=True).stdout
    with open(os.path.join(REPO, "doc", "config.md"), encoding="utf-8") as f:
        committed = f.read()
    assert committed == out, "doc/config.md is stale: run `make docs`"


def test_every_console_show_view_is_in_the_console_reference():
    with open(os.path.join(REPO, "doc", "console.md"), encoding="utf-8") as f:
        text = f.read()
    for view in ("POOLS", "CLIENTS", "SERVERS", "STATS", "DATABASES", "USERS", "CONFIG",
                 "LISTS", "VERSION", "STATE", "HELP", "PEERS", "PEER_POOLS"):
        assert f"SHOW {view}" in text, f"SHOW {view} missing from doc/console.md"
