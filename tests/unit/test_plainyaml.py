"""The node config's plain-YAML reader gives what PyYAML gives, or leaves the text to PyYAML."""

from __future__ import annotations

import random

import pytest
import yaml

from tenantnet.plugin import nodeconfig, plainyaml

LAB_LIKE = """# written by `tenantnetctl lab up`: points tenantnet at the lab's private OVS
ovsdb: unix:/run/tenantnet-lab/db.sock
stateDir: /run/tenantnet-lab/state
logFile: /run/tenantnet-lab/log/tenantnet.log
logLevel: info
# what a NAD may name on this lab node (docs/security.md)
deviceInfoDir: /run/tenantnet-lab/devinfo
ipamDataDirs: [/run/tenantnet-lab/ipam, /run/tenantnet-lab/host-local]
resolvConfPaths: [/run/tenantnet-lab/resolv.d]
ovsConfigurationPaths: []
agentSocket: "/run/tenantnet/agent.sock"   # the shim reads this line too
ovsdbTimeout: 2.5
ovsWait: true
"""

# Values and keys chosen to sit on the edges of YAML 1.1's implicit resolvers.
VALUES = ["/a/b", "unix:/x/db.sock", "tcp:1.2.3.4:6640", "info", "yes", "No", "ON", "off", "y", "n",
          "true", "False", "null", "~", "Null", "0", "007", "12", "-3", "+4", "1.5", "-0.5", "1e3", ".inf",
          "1_000", "0x1f", "1:20", "2001-12-14", "=", "<<", "a:", "a:b", "a::b", "a#b", "a #b", "a: b",
          "'q'", "''", "'it''s'", '"d"', '"e\\n"', "'a # b'", "[a, b]", "[]", "[ ]", "[a,b,]", "[1]", "[a:b]",
          "[/p, /q] # c", "[yes]", "{a: b}", "|", ">", "&x a", "*x", "!tag a", "@x", "`x", "%x", "-x",
          "- a", "?", "x ", "_x", "x.y", "x@y+z", "é", "\x7f", "a\x0cb", "NaN", ".nan", "Infinity"]
KEYS = ["ovsdb", "stateDir", "logLevel", "ovsWait", "on", "true", "null", "y", "k_1", "1k", "a b", "-k"]


def agree(text: str) -> None:
    got = plainyaml.read(text)
    try:
        want = yaml.safe_load(text)
    except yaml.YAMLError:
        assert got is None, (text, got)
        return
    assert got is None or (got == want and [type(v) for v in got.values()] ==
                           [type(v) for v in want.values()]), (text, got, want)


def test_a_flat_config_is_read_without_pyyaml_and_as_pyyaml_reads_it():
    assert plainyaml.read(LAB_LIKE) == yaml.safe_load(LAB_LIKE)


@pytest.mark.parametrize("value", VALUES)
def test_each_edge_value_agrees_with_pyyaml(value):
    agree(f"ovsdb: {value}\n")
    agree(f"ovsdb: {value} # comment\n")


@pytest.mark.parametrize("text", ["", "# only a comment\n", "---\novsdb: /x\n", "ovsdb:\n  - a\n",
                                  "a: 1\n  b: 2\n", "ovsdb: /x\n\tstateDir: /y\n", "ovsdb: /x\r\n",
                                  "ovsdb : /x\n", "ovsdb:/x\n", "- a list\n", "a: [unclosed\n",
                                  "ovsdb: /x\novsdb: /y\n", "x: 1\n...\n", "\ufeffovsdb: /x\n",
                                  "ovsdb: /x\n# \x00\n", "\x0c\n", "ovsdb: a\n  b\n", "ovsdb: #\n"])
def test_structure_edges_agree_with_pyyaml(text):
    agree(text)


def test_generated_texts_agree_with_pyyaml():
    rng = random.Random(7047)
    for _ in range(3000):
        lines = []
        for _ in range(rng.randint(1, 5)):
            kind = rng.random()
            if kind < 0.1:
                lines.append(rng.choice(["", "# c", "  # indented", "   "]))
            else:
                sep = rng.choice([": ", ":  ", ":", " : "]) if kind < 0.2 else ": "
                lines.append(f"{rng.choice(KEYS)}{sep}{rng.choice(VALUES)}{rng.choice(['', ' ', ' # t'])}")
        agree("\n".join(lines) + rng.choice(["\n", ""]))


def test_the_node_config_loader_does_not_import_pyyaml_for_a_flat_file(tmp_path):
    import subprocess
    import sys

    p = tmp_path / "n.yaml"
    p.write_text(LAB_LIKE.replace("/run/tenantnet-lab", str(tmp_path)).replace(
        '"/run/tenantnet/agent.sock"   # the shim reads this line too', f"{tmp_path}/agent.sock"))
    probe = ("import sys\nfrom tenantnet.plugin import nodeconfig\n"
             f"node = nodeconfig.load({str(p)!r})\nprint(node.ovsdb_timeout, 'yaml' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["2.5", "False"]
    assert nodeconfig.load(str(p)).ipam_data_dirs == (*nodeconfig.DEFAULT_IPAM_DATA_DIRS, f"{tmp_path}/ipam",
                                                      f"{tmp_path}/host-local")
