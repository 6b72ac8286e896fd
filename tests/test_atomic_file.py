"""The one atomic writer of the job payloads (jobs/atomic_file.py): all or nothing, no leftovers."""

import pytest

from atomic_file import atomic_open, write_atomic


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "dataset.json"
    write_atomic(path, "old\n")
    with pytest.raises(OSError, match="disk full"):
        with atomic_open(path, "w") as f:
            f.write("half of the new")
            raise OSError("disk full")
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["dataset.json"]
    write_atomic(path, b"new\n")
    assert path.read_bytes() == b"new\n" and len(list(tmp_path.iterdir())) == 1
