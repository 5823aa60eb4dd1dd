"""Which filesystem holds a target root decides whether small files are written inline."""

from pathlib import Path

from mcsync.stores.local_files import mount_fstype

MOUNTINFO = r"""22 1 252:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
30 22 0:26 / /dev/shm rw,nosuid,nodev shared:5 - tmpfs tmpfs rw
41 22 0:40 / /mnt/meta\040store rw,nosuid,nodev,relatime shared:20 - fuse.metafs metafs rw
42 22 0:41 / /mnt/nfs rw,relatime shared:21 - nfs4 host:/export rw
43 42 0:42 / /mnt/nfs rw,relatime shared:22 - tmpfs tmpfs rw
"""


def test_longest_mount_point_above_the_path_decides():
    assert mount_fstype(MOUNTINFO, "/home/user/ckpt") == "ext4"
    assert mount_fstype(MOUNTINFO, "/dev/shm/x") == "tmpfs"
    assert mount_fstype(MOUNTINFO, "/dev/shmx") == "ext4"  # a name prefix is not a mount


def test_escaped_mount_point_and_fuse_are_recognised():
    assert mount_fstype(MOUNTINFO, "/mnt/meta store/run-7") == "fuse.metafs"
    assert mount_fstype(MOUNTINFO, "/mnt/meta store") == "fuse.metafs"


def test_the_last_mount_on_a_point_is_the_visible_one():
    assert mount_fstype(MOUNTINFO, "/mnt/nfs/data") == "tmpfs"


def test_no_mount_known():
    assert mount_fstype("", "/x") is None


def test_a_fuse_mount_is_not_on_this_machine(monkeypatch):
    import mcsync.stores.local_files as lf

    monkeypatch.setattr(lf, "filesystem_type", lambda path: "fuse.seaweedfs")
    assert not lf.on_this_machine(Path("/mnt/bucket"))
    monkeypatch.setattr(lf, "filesystem_type", lambda path: "ext4")
    assert lf.on_this_machine(Path("/data"))


def test_no_fuse_device_skips_the_mounted_tests_saying_why(monkeypatch):
    import testbed.fuse

    monkeypatch.setattr(testbed.fuse.sys, "platform", "linux")
    monkeypatch.setattr(testbed.fuse.os.path, "exists", lambda p: p != "/dev/fuse")
    assert "no /dev/fuse" in (testbed.fuse.fuse_unavailable() or "")
