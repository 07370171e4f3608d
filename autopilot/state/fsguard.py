"""The one door for deleting or moving a directory: nothing outside the run, ever.

The autopilot runs as root overnight and removes scratch dirs, moves an attempt's
outputs aside and empties extraction dirs, all at paths rendered from templates and ids.
A template whose placeholder renders empty, an id of ``..``, a symlink planted in the
state dir: each would turn a routine clean-up into ``rm -rf`` of something else. So every
such path goes through here and must be:

  * absolute and non-empty, free of ``.`` / ``..`` components after rendering;
  * strictly inside one of the run's *roots*: the state dir, and for each path template
    of the preset (output dir, scratch dirs, extraction dir) the directory its static
    part names before the first per-cell placeholder (``{bench_dir}/tooling/workspace/``
    for ``{bench_dir}/tooling/workspace/{cell}``);
  * never ``/``, the home dir, the working dir, the state dir itself or an ancestor of
    any of them, nor reached through a symlink that leaves its root.

A refusal raises ``UnsafePath``; callers journal it and delete nothing (a wrong template
may fail a run, never empty a home directory).
"""

from __future__ import annotations

import os
import shutil
import stat
import string
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

from autopilot.config import Preset
from autopilot.errors import AutopilotError
from autopilot.templates import render

# Placeholders whose value differs per cell (or per attempt): a root ends before them.
PER_CELL = frozenset({"cell", "task", "arm", "mode", "n", "attempt", "output_dir",
                      "scratch_dir", "grade_file", "transcript", "deadline", "port",
                      "base_url", "model", "last_try"})


class UnsafePath(AutopilotError):
    """A deletion or move was refused: the path is not inside the run's roots."""


def _static_prefix(template: str, values: dict[str, str]) -> str | None:
    """The directory a path template names before its first per-cell placeholder; None
    for a template with none (one fixed path: no root, so nothing to delete by it) or
    whose static part is not a directory path."""
    out = ""
    for literal, field, _spec, _conv in string.Formatter().parse(template):
        out += literal
        if field is None:
            continue
        if field in PER_CELL or field not in values:
            return out.rsplit("/", 1)[0] if "/" in out else None
        out += values[field]
    return None


def run_roots(preset: Preset, state_dir: Path) -> tuple[Path, ...]:
    """Directories inside which this run may delete or move: see the module doc."""
    values = {**preset.vars, "state_dir": str(state_dir)}
    for task in preset.tasks:  # a var set by every task alike is static too
        values.update({k: v for k, v in task.vars.items()
                       if all(template.vars.get(k) == v for template in preset.tasks)})
    roots = [state_dir]
    for _key, template in _destructive_templates(preset):
        prefix = _static_prefix(template, values)
        if prefix:
            roots.append(Path(prefix))
    return tuple(_forbidden_filtered(dict.fromkeys(roots), state_dir))


def _destructive_templates(preset: Preset) -> list[tuple[str, str]]:
    """(config key, template) of every path the autopilot deletes, moves or extracts into."""
    out = [("harness.output_dir", preset.harness.output_dir),
           ("grader.grade_file", preset.grader.grade_file)]
    out += [(f"harness.scratch_dirs[{i}]", template)
            for i, template in enumerate(preset.harness.scratch_dirs)]
    if preset.grader.extract:
        out.append(("grader.extract.into", preset.grader.extract.into))
    return out


# Stands in for the state dir at load, when the real one (a flag) is not known yet.
_LOAD_STATE_DIR = Path("/nonexistent-state-dir")


def template_problems(preset: Preset) -> list[tuple[str, str]]:
    """(config key, why) for every destructive path template that would be refused for
    some cell, found at admission (a check handed to the loader) where the template
    shows it (an empty placeholder, a relative result, a path outside the run's roots):
    a config error, never a run that refuses each deletion later."""
    from autopilot.plan import Plan, cell_context  # plan imports config only: no cycle

    roots = run_roots(preset, _LOAD_STATE_DIR)
    problems: dict[str, str] = {}
    for cell in Plan(preset, 1).cells:  # every task x arm: their vars differ
        ctx = cell_context(preset, cell, 1, _LOAD_STATE_DIR)
        for key, template in _destructive_templates(preset):
            if key in problems:
                continue
            try:
                check(render(template, ctx), roots, _LOAD_STATE_DIR)
            except UnsafePath as e:
                problems[key] = f"unsafe path {template!r} for cell {cell.id}: {e}"
    return list(problems.items())


def _protected(state_dir: Path) -> list[Path]:
    return [Path("/"), Path.home(), Path.cwd(), state_dir]


def _forbidden_filtered(roots: Iterable[Path], state_dir: Path) -> list[Path]:
    """Roots must themselves be absolute, clean and not an ancestor of something we
    protect (a root of ``/`` or of the home dir would allow anything)."""
    out = []
    for root in roots:
        if not root.is_absolute() or any(part in (".", "..") for part in root.parts):
            continue
        if root != state_dir and any(_within(part, root) for part in _protected(state_dir)):
            continue
        out.append(root)
    return out


def _within(path: Path, root: Path) -> bool:
    """``path`` is ``root`` or below it (lexically)."""
    return path == root or root in path.parents


def check(path: Path | str, roots: Iterable[Path], state_dir: Path) -> Path:
    """The path, if the run may delete or move it; else UnsafePath naming why."""
    raw = str(path)
    target = Path(raw)
    if not raw or not target.is_absolute():
        raise UnsafePath(f"refused {raw!r}: not an absolute path")
    if any(part in (".", "..") for part in raw.split("/")):
        raise UnsafePath(f"refused {raw}: '.' or '..' in the path")
    for guarded in _protected(state_dir):
        if _within(guarded, target):
            raise UnsafePath(f"refused {target}: it is or contains {guarded}")
    roots = tuple(roots)
    root = next((candidate for candidate in roots
                 if target != candidate and candidate in target.parents), None)
    if root is None:
        raise UnsafePath(f"refused {target}: outside the run's roots "
                         f"({', '.join(map(str, roots)) or 'none'})")
    # A symlinked component may lead anywhere: the real path must stay inside too.
    real_parent, real_root = target.parent.resolve(), root.resolve()
    if not _within(real_parent, real_root):
        raise UnsafePath(f"refused {target}: resolves outside {root} (through a symlink)")
    return target


class NotRemoved(UnsafePath):
    """A removal the guard allowed that the filesystem did not finish (files this user
    may not delete: a root-owned sandbox's output). ``path`` is the checked path."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(f"{path}: not removed ({why})")
        self.path = path


def remove_tree(path: Path | str, roots: Iterable[Path], state_dir: Path) -> bool:
    """Remove a directory (or a file) inside the run's roots; False if it was not there.
    A symlink is removed itself, never followed. What is left (permissions) raises
    NotRemoved: a caller never goes on believing the path is gone."""
    target = check(path, roots, state_dir)
    try:
        mode = target.lstat().st_mode
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(mode):
        # A file, a symlink, and also a FIFO or a socket a harness left: unlinked, never
        # opened (rmtree opens its argument, and opening a FIFO blocks for good).
        target.unlink(missing_ok=True)
        return True
    failed = _remove_dir(target)
    if failed or os.path.lexists(target):
        raise NotRemoved(target, f"{len(failed)} entries left, first "
                                 f"{failed[0] if failed else target}")
    return True


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _remove_dir(top: Path) -> list[str]:
    """Remove the tree at ``top`` without recursion and with one directory open at a
    time: a harness's 3000-level tree (or one deeper than PATH_MAX, or than the fd
    limit) is removed like a flat one. Every step is relative to a directory descriptor
    (``unlinkat``/``openat``) and never follows a symlink; the way back up is checked
    against the device and inode seen on the way down, so a directory moved meanwhile
    stops the removal there instead of taking it elsewhere. Returns what was left."""
    failed: list[str] = []
    skip: set[tuple[int, int]] = set()  # entries that would not go: not tried again
    try:
        cur = os.open(top, _DIR_FLAGS)
    except OSError as err:
        return [f"{top}: {err.strerror}"]
    path: list[tuple[int, int, str]] = []  # (dev, ino) of each parent, and our name in it
    try:
        while True:
            sub = None
            with os.scandir(cur) as listing:
                entries = list(listing)
            for ent in entries:
                try:
                    info = ent.stat(follow_symlinks=False)
                except OSError:
                    continue
                if (info.st_dev, info.st_ino) in skip:
                    continue
                if stat.S_ISDIR(info.st_mode):
                    sub = sub or ent.name
                    continue
                try:
                    os.unlink(ent.name, dir_fd=cur)
                except FileNotFoundError:
                    pass
                except OSError as err:
                    skip.add((info.st_dev, info.st_ino))
                    where = "/".join([str(top), *(part_name for *_, part_name in path), ent.name])
                    failed.append(f"{where}: {err.strerror}")
            if sub is not None:
                try:
                    down = os.open(sub, _DIR_FLAGS, dir_fd=cur)
                except OSError as err:
                    info = os.stat(sub, dir_fd=cur, follow_symlinks=False)
                    skip.add((info.st_dev, info.st_ino))
                    failed.append(f"{sub}: {err.strerror}")
                    continue
                here = os.fstat(cur)
                path.append((here.st_dev, here.st_ino, sub))
                os.close(cur)
                cur = down
                continue
            if not path:  # the top is empty (or holds only what would not go)
                break
            dev, ino, name = path.pop()
            parent_fd = os.open("..", _DIR_FLAGS, dir_fd=cur)
            info = os.fstat(parent_fd)
            mine = os.fstat(cur)
            os.close(cur)
            cur = parent_fd
            if (info.st_dev, info.st_ino) != (dev, ino):
                failed.append(f"{name}: its parent was moved during the removal")
                break
            try:
                os.rmdir(name, dir_fd=cur)
            except FileNotFoundError:
                pass
            except OSError as err:
                skip.add((mine.st_dev, mine.st_ino))
                failed.append(f"{name}: {err.strerror}")
    finally:
        os.close(cur)
    if not failed:
        try:
            os.rmdir(top)
        except FileNotFoundError:
            pass
        except OSError as err:
            failed.append(f"{top}: {err.strerror}")
    return failed


# Where a cell's uid (no account, no home) can write outside its own cell: the machine's
# world-writable sticky dirs. In them no one else can rename or replace its entries.
SHARED_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/dev/mqueue")


def remove_owned_by(uid: int, dirs: Iterable[str] = SHARED_DIRS) -> list[str]:
    """What ``uid`` left directly inside the shared sticky dirs (a file, a FIFO, a
    symlink itself, a directory with its whole tree), removed before the uid is handed
    to another cell or another run: the uid's next holder reaches nothing of its last.
    Only a root-owned, sticky, world-writable directory is looked into, through a
    descriptor that follows no symlink. Call it only for a uid with no process left
    (autopilot.cell.users.UidPool.take), so nothing of it changes meanwhile. Returns
    what was removed."""
    removed: list[str] = []
    for top in dirs:
        try:
            fd = os.open(top, _DIR_FLAGS)
        except OSError:
            continue
        try:
            info = os.fstat(fd)
            if info.st_uid != 0 or not info.st_mode & stat.S_ISVTX or not info.st_mode & 0o002:
                continue
            with os.scandir(fd) as listing:
                mine = [e.name for e in listing if _owner(e) == uid]
            for name in mine:
                where = f"{top}/{name}"
                if stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                    if not _remove_dir(Path(where)):
                        removed.append(where)
                else:
                    os.unlink(name, dir_fd=fd)
                    removed.append(where)
        except OSError:
            continue
        finally:
            os.close(fd)
    return removed


def _owner(entry: os.DirEntry[str]) -> int | None:
    try:
        return entry.stat(follow_symlinks=False).st_uid
    except OSError:
        return None


Clear = Callable[[str], Awaitable[str | None]]  # empties a dir another way; None: done


async def remove_or_clear(path: Path | str, roots: Iterable[Path], state_dir: Path,
                          clear: Clear | None) -> tuple[str | None, str]:
    """``remove_tree``, and where the filesystem left files this user may not delete (a
    root-owned sandbox's), ``clear`` (the sandboxes' Docker daemon) empties the dir
    before it is removed. Returns (why it is still there, or None; how it went:
    "removed", "cleared" (through ``clear``), "not_removed" or "refused" (the guard's
    refusal)). Never raises for a path it may not touch."""
    import anyio

    roots = tuple(roots)
    try:
        await anyio.to_thread.run_sync(remove_tree, path, roots, state_dir)
        return None, "removed"
    except NotRemoved as e:
        if clear is None:
            return (f"{e} (set harness.scratch_remove_image to remove it through Docker)",
                    "not_removed")
        failed = await clear(str(e.path))
        if failed is not None:
            return f"{e}; through Docker: {failed}", "not_removed"
    except UnsafePath as e:
        return str(e), "refused"
    try:  # emptied: the dir itself is ours to remove
        await anyio.to_thread.run_sync(remove_tree, path, roots, state_dir)
    except NotRemoved as again:
        return str(again), "not_removed"
    except UnsafePath as again:
        return str(again), "refused"
    return None, "cleared"


def remove_stale_temps(state_dir: Path) -> list[Path]:
    """Remove the temp files of atomic writes killed mid-way (``.status.json.*.tmp``...):
    at start, with the lock held, no writer of ours can still be using one."""
    from autopilot.state.fsutil import stale_temps

    gone = [temp for temp in stale_temps(state_dir) if remove_tree(temp, (state_dir,), state_dir)]
    return gone


def move_tree(src: Path, dest: Path, roots: Iterable[Path], state_dir: Path) -> None:
    """Move ``src`` to ``dest``, both inside the run's roots."""
    roots = tuple(roots)
    check(src, roots, state_dir)
    check(dest, roots, state_dir)
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(src), str(dest))
