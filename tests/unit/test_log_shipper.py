"""The log shipper's stand-in copies each container log as it grows, keeps what a rotated or deleted file
held at its last write, and resumes where it stopped without copying a line twice."""
from __future__ import annotations

from pathlib import Path

from localenv.log_shipper import Shipper

REL = Path("gpufleet-system_gpufleet-reconciler-abc_0123/reconciler/0.log")


def _line(n: int) -> bytes:
    return f"2026-01-01T00:00:{n:02d}.000000000Z stderr F line {n}\n".encode()


def _append(path: Path, *lines: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "ab") as f:
        f.write(b"".join(lines))


def test_copies_what_is_appended(tmp_path):
    src, dest = tmp_path / "pod-logs", tmp_path / "archive"
    shipper = Shipper(src, dest)
    _append(src / REL, _line(1))
    assert shipper.poll() == len(_line(1))
    _append(src / REL, _line(2), _line(3))
    shipper.poll()
    assert (dest / REL).read_bytes() == _line(1) + _line(2) + _line(3)
    assert shipper.poll() == 0


def test_a_deleted_pods_last_lines_remain(tmp_path):
    """The kubelet removes a deleted pod's log folder: what was written before that is kept, even when
    the last lines came after the previous look."""
    src, dest = tmp_path / "pod-logs", tmp_path / "archive"
    shipper = Shipper(src, dest)
    _append(src / REL, _line(1))
    shipper.poll()
    _append(src / REL, _line(2))  # the leader's last words...
    for p in sorted((src / REL.parts[0]).rglob("*"), reverse=True):  # ...then the folder goes
        p.unlink() if p.is_file() else p.rmdir()
    (src / REL.parts[0]).rmdir()
    shipper.poll()
    assert (dest / REL).read_bytes() == _line(1) + _line(2)


def test_a_rotated_file_is_finished_and_the_new_one_follows(tmp_path):
    src, dest = tmp_path / "pod-logs", tmp_path / "archive"
    shipper = Shipper(src, dest)
    _append(src / REL, _line(1))
    shipper.poll()
    _append(src / REL, _line(2))
    (src / REL).rename(src / REL.with_name("0.log.20260101-000002"))  # the kubelet's rotation
    _append(src / REL, _line(3))
    shipper.poll()
    assert (dest / REL).read_bytes() == _line(1) + _line(2) + _line(3)


def test_a_restarted_shipper_resumes_without_copying_twice(tmp_path):
    src, dest = tmp_path / "pod-logs", tmp_path / "archive"
    first = Shipper(src, dest)
    _append(src / REL, _line(1))
    first.poll()
    first.close()
    _append(src / REL, _line(2))
    second = Shipper(src, dest)
    second.poll()
    assert (dest / REL).read_bytes() == _line(1) + _line(2)
