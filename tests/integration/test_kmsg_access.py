"""What reading /dev/kmsg needs, on the kernel these tests run on: the facts components/agent.py builds the
node agent's security context on.

- The kernel (kernel/printk/printk.c, check_syslog_permissions): under `kernel.dmesg_restrict=1` a reader
  needs CAP_SYSLOG; under 0 anyone may read. These tests read the setting and check what it implies; they
  never change it (the machine is shared).
- The container's device cgroup (cgroup v1 `devices`): with the allow-list runc gives a container that is
  not privileged, /dev/kmsg cannot be opened whatever the capabilities; with `c 1:11 r` added (what a
  device plugin's DeviceSpec makes the runtime add) it can.

Needs root and util-linux's setpriv; the device-cgroup test needs the cgroup v1 devices hierarchy.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv")]

PYTHON = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else shutil.which("python3")
READ = "import os; fd = os.open('/dev/kmsg', os.O_RDONLY | os.O_NONBLOCK); os.read(fd, 8192); print('read')"
NOBODY = ["--reuid=65532", "--regid=65532", "--clear-groups"]
DEVICES = Path("/sys/fs/cgroup/devices")
# runc's default devices for a container that is not privileged (libcontainer/specconv AllowedDevices):
# null, zero, full, random, urandom, tty, console, ptmx, pts, and mknod of anything.
RUNC_ALLOWED = ["c 1:3 rwm", "c 1:5 rwm", "c 1:7 rwm", "c 1:8 rwm", "c 1:9 rwm", "c 5:0 rwm", "c 5:1 rwm",
                "c 5:2 rwm", "c 136:* rwm", "c *:* m", "b *:* m"]


def dmesg_restrict() -> int:
    return int(Path("/proc/sys/kernel/dmesg_restrict").read_text())


def read_kmsg(*setpriv: str, cgroup: Path | None = None) -> tuple[bool, str]:
    """Open and read /dev/kmsg in a child with these setpriv options (and in `cgroup`, if given)."""
    enter = f"echo $$ > {cgroup}/cgroup.procs && " if cgroup else ""
    r = subprocess.run(["bash", "-c", f"{enter}exec setpriv {' '.join(setpriv)} {PYTHON} -c \"{READ}\""],
                       capture_output=True, text=True, timeout=30)
    return r.returncode == 0 and "read" in r.stdout, r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""


def test_cap_syslog_is_what_a_reader_needs_under_dmesg_restrict():
    restricted = dmesg_restrict() == 1
    plain, why = read_kmsg(*NOBODY, "--inh-caps=-all", "--bounding-set=-all")
    assert plain is not restricted, why  # no capability: readable only when not restricted
    if restricted:
        assert "Operation not permitted" in why
    syslog, why = read_kmsg(*NOBODY, "--inh-caps=-all,+syslog", "--ambient-caps=+syslog", "--bounding-set=-all,+syslog")
    assert syslog, why  # CAP_SYSLOG alone suffices either way
    admin, why = read_kmsg(*NOBODY, "--inh-caps=-all,+sys_admin", "--ambient-caps=+sys_admin",
                           "--bounding-set=-all,+sys_admin")
    assert admin is not restricted, why  # CAP_SYS_ADMIN does not stand in for it on this kernel
    # root with every capability dropped but CAP_SYSLOG: the agent's context with a device plugin
    root_syslog, why = read_kmsg("--inh-caps=-all,+syslog", "--ambient-caps=+syslog", "--bounding-set=-all,+syslog")
    assert root_syslog, why


@pytest.fixture
def device_cgroup():
    if not (DEVICES / "devices.allow").exists():
        pytest.skip("no cgroup v1 devices hierarchy")
    group = DEVICES / f"gpufleet-test-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        (group / "devices.deny").write_text("a")
        for rule in RUNC_ALLOWED:
            (group / "devices.allow").write_text(rule)
        yield group
    finally:
        for pid in (group / "cgroup.procs").read_text().split():
            (DEVICES / "cgroup.procs").write_text(pid)  # none should be left; move any back before removing
        group.rmdir()


def test_a_container_device_cgroup_refuses_dev_kmsg_unless_the_device_is_added(device_cgroup):
    every_cap, why = read_kmsg(cgroup=device_cgroup)  # root, every capability: still refused
    assert not every_cap and "Operation not permitted" in why, why
    (device_cgroup / "devices.allow").write_text("c 1:11 r")  # what a device plugin's DeviceSpec adds
    ok, why = read_kmsg("--inh-caps=-all,+syslog", "--ambient-caps=+syslog", "--bounding-set=-all,+syslog",
                        cgroup=device_cgroup)
    assert ok, why
