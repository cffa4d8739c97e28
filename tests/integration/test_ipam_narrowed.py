"""DEL after the admin narrowed ipamDataDirs (issue 26 D5): the tenantnet plugin's DEL still
releases the tenantnet-ipam address its ADD allocated, from the store tenantnet listed."""

from __future__ import annotations

import sqlite3
from contextlib import closing

from tests.integration.conftest import new_cid


def _held(db: str) -> list[str]:
    with closing(sqlite3.connect(db)) as conn:
        return [r[0] for r in conn.execute("SELECT container_id FROM allocation")]


def test_del_releases_where_add_allocated_after_ipam_data_dirs_narrowed(lab, plugin, netns_factory, tmp_path):
    extra = tmp_path / "extra"
    extra.mkdir(mode=0o700)
    lines = lab.node_config.read_text().splitlines()
    wide = [f"{line[:-1]}, {extra}]" if line.startswith("ipamDataDirs: [") else line for line in lines]
    before = tmp_path / "before.yaml"
    before.write_text("\n".join(wide) + "\n")
    data_dir = extra / "blue"
    conf = plugin.conf(ipam={"type": "tenantnet-ipam", "ranges": [[{"subnet": "10.78.0.0/24"}]],
                             "dataDir": str(data_dir)})
    ns = netns_factory()
    cid = new_cid()
    plugin.extra_env["TENANTNET_CONFIG"] = str(before)
    inv = plugin.add(conf, ns, cid)
    assert inv.code == 0, inv.stdout
    assert _held(str(data_dir / "ipam.db")) == [cid]
    # the upgrade: the node config no longer allows the directory
    plugin.extra_env["TENANTNET_CONFIG"] = str(lab.node_config)
    refused = plugin.add(conf, netns_factory(), new_cid())
    assert refused.out["code"] == 7 and "ipam.dataDir" in refused.out["msg"]
    assert plugin.call("DEL", conf, cid, ns.path).code == 0
    assert _held(str(data_dir / "ipam.db")) == []
    assert lab.owned_ports() == []
