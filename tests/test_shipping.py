"""What a node ships back is untrusted: autopilot.backends.ray.shipping writes only regular
files and directories, inside the state dir, through no symlink."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

from autopilot.backends.ray.shipping import cell_files, pack, unpack


def _tar(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _file(name: str, data: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    return tarfile.TarInfo(name), data


def _special(name: str, kind: bytes, link: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info, None


def test_a_cells_files_round_trip_into_the_state_dir(tmp_path: Path) -> None:
    node, head = tmp_path / "node", tmp_path / "head"
    out = node / "cells" / "c1"
    out.mkdir(parents=True)
    (out / "summary.json").write_text('{"ok": 1}')
    (out / "sub").mkdir()
    (out / "sub" / "t.jsonl").write_text("row\n")
    (node / "logs").mkdir()
    (node / "logs" / "c1.launcher.log").write_text("launched\n")
    head.mkdir()
    written, skipped = unpack(pack(node, cell_files(node, "c1", out)), head)
    assert (written, skipped) == (3, [])
    assert (head / "cells" / "c1" / "sub" / "t.jsonl").read_text() == "row\n"
    assert (head / "logs" / "c1.launcher.log").read_text() == "launched\n"
    assert (head / "cells" / "c1" / "summary.json").stat().st_mode & 0o777 == 0o600


def test_hostile_members_are_skipped_and_said(tmp_path: Path) -> None:
    head, victim = tmp_path / "head", tmp_path / "victim"
    head.mkdir()
    victim.mkdir()
    (head / "cells").mkdir()
    os.symlink(victim, head / "cells" / "linked")  # planted: a parent that is a symlink
    os.symlink(victim / "f", head / "cells" / "target")  # planted: the name is a symlink
    data = _tar([
        _file("/etc/evil"), _file("../escape"), _file("cells/../../escape2"),
        _special("cells/ln", tarfile.SYMTYPE, "/etc/passwd"),
        _special("cells/hard", tarfile.LNKTYPE, "/etc/passwd"),
        _special("cells/dev", tarfile.CHRTYPE),
        _special("cells/fifo", tarfile.FIFOTYPE),
        _file("cells/linked/owned"), _file("cells/target"),
        _file("cells/ok.txt", b"fine"),
    ])
    written, skipped = unpack(data, head)
    assert written == 1 and (head / "cells" / "ok.txt").read_bytes() == b"fine"
    assert len(skipped) == 9, skipped
    assert list(victim.iterdir()) == []  # nothing written through either symlink
    assert not (tmp_path / "escape").exists() and not (tmp_path / "escape2").exists()
    assert not (head / "cells" / "ln").exists() and not (head / "cells" / "dev").exists()
