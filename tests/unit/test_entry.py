"""The executable frame: stdout carries only the result or the error; VERSION stays light."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from cni import skel
from cni.errors import CniError, Code

PLUGIN = str(Path(sys.executable).parent / "tenantnet")


def test_handler_error_becomes_cni_error_json_in_config_version():
    def handler(env, raw):
        raise CniError(Code.INVALID_CONFIG, "invalid network config: vlan=5000: no")

    code, out = skel.run(handler, {"CNI_COMMAND": "GC"}, b'{"cniVersion": "0.4.0"}')
    assert code == 1
    assert json.loads(out) == {"cniVersion": "0.4.0", "code": 7, "msg": "invalid network config: vlan=5000: no"}


def test_bug_becomes_code_100_without_traceback():
    seen = []

    def handler(env, raw):
        raise KeyError("boom")

    code, out = skel.run(handler, {"CNI_COMMAND": "GC"}, b'{"cniVersion": "1.0.0"}', seen.append)
    err = json.loads(out)
    assert code == 1 and err["code"] == 100 and "KeyError" in err["msg"] and "Traceback" not in out
    assert isinstance(seen[0], KeyError)


def test_error_for_unsupported_config_version_is_written_in_current_version():
    def handler(env, raw):
        raise CniError(Code.INCOMPATIBLE_VERSION, "incompatible")

    code, out = skel.run(handler, {"CNI_COMMAND": "STATUS"}, b'{"cniVersion": "7.0.0"}')
    assert code == 1 and json.loads(out)["cniVersion"] == "1.1.0"


def test_version_does_not_import_heavy_libraries():
    probe = (
        "import sys, io, os\n"
        "os.environ['CNI_COMMAND'] = 'VERSION'\n"
        "sys.stdin = io.TextIOWrapper(io.BytesIO(b'{\"cniVersion\":\"1.0.0\"}'))\n"
        "from tenantnet.entry import plugin as main\n"
        "try:\n    main.main()\nexcept SystemExit:\n    pass\n"
        "heavy = [m for m in ('pyroute2', 'structlog', 'yaml') if m in sys.modules]\n"
        "sys.stderr.write(repr(heavy))\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert json.loads(proc.stdout)["supportedVersions"] == ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]
    assert proc.stderr == "[]"


def test_executable_reports_bad_node_config_as_cni_error(tmp_path):
    bad = tmp_path / "node.yaml"
    bad.write_text("stateDir: relative\n")
    env = {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "c1", "CNI_IFNAME": "net1", "CNI_NETNS": "",
           "TENANTNET_CONFIG": str(bad), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([PLUGIN], input=b'{"cniVersion":"1.0.0","name":"n","type":"tenantnet"}',
                          env=env, capture_output=True, check=False)
    err = json.loads(proc.stdout)
    assert proc.returncode == 1 and err["code"] == 7 and str(bad) in err["msg"]


def test_env_error_is_written_in_the_configs_version():
    code, out = skel.run(lambda e, r: None, {"CNI_COMMAND": "DEL"}, b'{"cniVersion": "1.0.0"}')
    err = json.loads(out)
    assert code == 1 and err["code"] == 4 and err["cniVersion"] == "1.0.0"


def test_the_plugins_environment_has_no_rich():
    """structlog imports `rich` whenever it is installed (≈ 50 ms on every in-process call and
    every agent start); the lint tools that pull it in live in .venv-lint, not here."""
    proc = subprocess.run([sys.executable, "-c", "import sys, structlog; print('rich' in sys.modules)"],
                          capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "False"


def test_the_in_process_ovs_path_imports_neither_pyroute2_nor_yaml(tmp_path):
    """What an in-process `ovs` ADD/DEL imports (the plugin, mode ovs's driver, the OVSDB
    client, a flat node config): no pyroute2, no PyYAML. The real ADD is checked in
    tests/integration/test_ovsdb_direct.py."""
    node = tmp_path / "node.yaml"
    node.write_text(f"ovsdb: unix:{tmp_path}/db.sock\nstateDir: {tmp_path}/state\nlogLevel: info\n")
    probe = (
        "import sys\n"
        "from tenantnet.entry import plugin\n"
        "from tenantnet.plugin import core, modes, nodeconfig\n"
        "from tenantnet.plugin.drivers import ovs, ovsport\n"
        "from tenantnet.plugin.system import ovsdb\n"
        f"node = nodeconfig.load({str(node)!r})\n"
        "modes.for_mode('ovs', node)\n"
        "ovsport.ovsdb_for(node)\n"
        "print(sorted(m for m in ('pyroute2', 'yaml') if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]"
