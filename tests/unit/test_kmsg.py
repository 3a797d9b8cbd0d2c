"""Kernel-log parsing on realistic NVRM Xid lines, malformed ones included."""
import pytest

from reconciler.agent.kmsg import Malformed, XidEvent, parse_line


@pytest.mark.parametrize("line,xid,pci,detail", [
    ("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.", 79, "PCI:0000:3b:00",
     "GPU has fallen off the bus."),
    ("[ 1843.451234] NVRM: Xid (PCI:0000:b7:00): 48, pid=20331, DBE (double bit error) ECC error detected.", 48,
     "PCI:0000:b7:00", "DBE (double bit error) ECC error detected."),
    ("6,2041,5678901234,-;NVRM: Xid (PCI:0000:18:00): 94, pid='<unknown>', name=<unknown>, Contained: SM (0x1).",
     94, "PCI:0000:18:00", "Contained: SM (0x1)."),
    ("kernel: NVRM: Xid (PCI:0008:01:00): 119, pid=3120, name=python3, Timeout after 6s of waiting for RPC response",
     119, "PCI:0008:01:00", "Timeout after 6s of waiting for RPC response"),
    ("NVRM: Xid (PCI:0000:3b:00): 13, Graphics SM Warp Exception on (GPC 0, TPC 1)", 13, "PCI:0000:3b:00",
     "Graphics SM Warp Exception on (GPC 0, TPC 1)"),
    ("NVRM: Xid (PCI:0000:3b:00): 74", 74, "PCI:0000:3b:00", ""),
])
def test_parses_driver_lines(line, xid, pci, detail):
    ev = parse_line(line)
    assert ev == XidEvent(xid, pci, detail)
    assert str(xid) in ev.message


@pytest.mark.parametrize("line", [
    "NVRM: Xid (PCI:0000:3b:00): seventy-nine, pid=1",
    "NVRM: Xid (PCI:0000:3b:00 79, missing paren",
    "NVRM: Xid",
    "6,1,2,-;NVRM: Xid (): , ",
])
def test_malformed_xid_lines_are_reported_not_raised(line):
    assert isinstance(parse_line(line), Malformed)


@pytest.mark.parametrize("line", ["", "usb 1-1: new high-speed USB device", "NVRM: loading NVIDIA UNIX x86_64 Kernel Module",
                                  "\x00\xff garbage"])
def test_other_lines_are_ignored(line):
    assert parse_line(line) is None
