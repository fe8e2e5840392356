"""The files of a node's segments: where they live, and how they are made, opened and
mapped safely (the store, _objects/store.py, decides which exist; writers and readers
open and map them here).

Where segments live: a directory of the session under /dev/shm, made by the store
(``orchestra-<uid>-<head pid>-<session>-<random>``, mode 0700, checked after mkdir).
/dev/shm itself is writable by every user: segments there under predictable names let
another user squat the next names (every large put failed with FileExistsError) or
plant a pickle at the name of a spilled segment (the next get unpickled it: code
execution as the session's user). In the private directory only the session's user
can list, create or open anything. On top of that every open is O_NOFOLLOW (O_EXCL as
well when creating), and before a map the file must be a regular file of this user with
mode 0600. A failed create or map raises ObjectStoreError naming the file; the writer
then asks the store to give back the bytes counted for the segment (abort). The pid in
the directory's name tells a later session which directories a crashed head left
behind (sweep_stale_segments). Every path of a segment is made by segment_path();
a slot of a slab (_objects/slabs.py, ``slab-<n>.<c>@<offset>``) is a range of its slab's
file (segment_file): the store makes and sizes the file, writers and readers map their
slot's range of it, and a writer allocates only its slot's pages.

Huge pages (ORCHESTRA_HUGE_PAGES, a hugetlbfs mount): large objects go to files in a
private directory of the session on that mount (make_huge_dir: the same name, mode and
checks as the one under /dev/shm), which the session's directory links to as ``huge``:
their segments are named ``huge/<name>``, so every process finds them as it finds the
others. A hugetlbfs file is written through maps only (no write(), no sendfile(): the
spill and the transfer read it through a map or read() instead), and sized in whole
huge pages.
"""
from __future__ import annotations

import errno
import mmap
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Callable

from .._platform.procutil import pid_alive
from .._proto import types_pb2
from ..exceptions import ObjectStoreError, ObjectStoreFullError
from .pages import ALLOCATE_MIN, map_allocating, map_for_writing, map_length, populate_write
from .serialization import Serialized
from .slabs import is_slot, split_slot

SHM_DIR = "/dev/shm"
HUGE = "huge"                  # the link in a session's directory to its huge-page one
DIR_PREFIX = "orchestra-"      # + <uid>-<head pid>-<session>-<random>: see make_session_dir
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
_WARM_CHUNK = 8 << 20


def fmt_bytes(n: float) -> str:
    """Bytes for a message: 512 B, 1.5 KiB, 2.0 GiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


# ---------------------------------------------------------------- the private directory


def session_dir_prefix(pid: int) -> str:
    """The start of the name of every segment directory the store of process ``pid``
    makes under /dev/shm (this user's)."""
    return f"{DIR_PREFIX}{os.geteuid()}-{pid}-"


def make_session_dir(session: str) -> str:
    """Create the session's directory of segments under /dev/shm: mode 0700, a name
    nobody can guess (mkdtemp retries on a name taken already, so squatting it only
    costs the squatter)."""
    prefix = f"{session_dir_prefix(os.getpid())}{session}-"
    try:
        path = tempfile.mkdtemp(prefix=prefix, dir=SHM_DIR)
    except OSError as exc:
        raise ObjectStoreError(
            f"cannot create the session's shared-memory directory in {SHM_DIR} "
            f"({exc.strerror}): the object store needs a writable {SHM_DIR} (a tmpfs). "
            f"Mount one, or give this user write access to it.") from exc
    os.chmod(path, 0o700)   # mkdir's mode is masked by the umask; nobody else can swap it
    check_private_dir(path)
    return path


def check_private_dir(path: str) -> None:
    """Raise ObjectStoreError unless ``path`` is a directory (not a link) of this user
    with mode 0700: only then can no other user put or replace a file in it."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise ObjectStoreError(f"cannot check the private directory {path} ({exc.strerror})") from exc
    problem = _not_own(st, stat.S_ISDIR, "a directory", 0o700)
    if problem:
        raise ObjectStoreError(
            f"{path} is not this session's private directory: {problem}. Another user or "
            "program made or changed it; remove it (or pick another spill_dir=) and start "
            "the cluster again.")


def remove_private_dir(path: str) -> bool:
    """Remove a directory of segments made by make_session_dir, if it is ours."""
    try:
        check_private_dir(path)
    except ObjectStoreError:
        return False   # gone already, or not ours to remove
    shutil.rmtree(path, ignore_errors=True)
    return True


def segment_path(folder: str, name: str) -> str:
    """The file of segment ``name`` in the session's directory ``folder`` (``huge/<n>``:
    in its huge-page directory, through the link; a slot: its slab's file)."""
    return segment_file(folder, name)[0]


def segment_file(folder: str, name: str) -> tuple[str, int]:
    """(path, offset) of segment ``name``'s bytes: a file of ``folder`` at 0, or a slot
    (``slab-<n>.<c>@<offset>``) at its offset in its slab's file."""
    try:
        file, offset = split_slot(name)
    except ValueError:
        file, offset = "", 0
    base = file[len(HUGE) + 1:] if file.startswith(HUGE + "/") else file
    if "/" in base or base.startswith(".") or not base or offset % mmap.ALLOCATIONGRANULARITY:
        raise ObjectStoreError(f"bad segment name {name!r}: not a file of {folder}")
    return f"{folder}/{file}", offset


def make_slab(path: str, size: int) -> None:
    """Create a slab's file (sized, no page allocated): the store, as it carves one."""
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR | _NOFOLLOW, 0o600)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


def punch(path: str, ranges: list[tuple[int, int]]) -> None:
    """Give the pages of ``ranges`` (offset, length) of a slab's file back to the
    machine (MADV_REMOVE: tmpfs frees them, the file keeps its size and reads zeros
    there). A file gone already has nothing to give back."""
    try:
        fd = os.open(path, os.O_RDWR | _NOFOLLOW)
    except OSError:
        return
    try:
        for offset, length in ranges:
            mm = mmap.mmap(fd, length, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE,
                           offset=offset)
            try:
                mm.madvise(mmap.MADV_REMOVE)
            finally:
                mm.close()
    except OSError:
        pass   # the pages stay until the file goes
    finally:
        os.close(fd)


def make_huge_dir(folder: str, mount: str) -> str:
    """The session's private directory on the hugetlbfs ``mount`` (named as ``folder``,
    its directory under /dev/shm, so that sweep_stale_segments finds it there too),
    linked from ``folder`` as ``huge``."""
    try:
        path = tempfile.mkdtemp(prefix=os.path.basename(folder) + "-", dir=mount)
    except OSError as exc:
        raise ObjectStoreError(f"cannot create the session's directory in {mount} "
                               f"({exc.strerror}) for its huge pages (ORCHESTRA_HUGE_PAGES)") from exc
    os.chmod(path, 0o700)
    check_private_dir(path)
    os.symlink(path, f"{folder}/{HUGE}")
    return path


def huge_page_mount(path: str) -> str:
    """Why ``path`` cannot hold the objects' huge pages; "" when it can: a directory of
    a hugetlbfs mount that this user may write."""
    real = os.path.realpath(path)
    if not os.path.isdir(real):
        return f"{path} is not a directory"
    mounts: list[tuple[str, str]] = []
    try:
        with open("/proc/self/mounts", encoding="utf-8") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3:
                    mounts.append((parts[1].replace("\\040", " "), parts[2]))
    except OSError as exc:
        return f"cannot read /proc/self/mounts ({exc.strerror})"
    fstype = max(((m, t) for m, t in mounts if real == m or real.startswith(m.rstrip("/") + "/")),
                 key=lambda mt: len(mt[0]), default=("", ""))[1]
    if fstype != "hugetlbfs":
        return f"{path} is on a {fstype or 'unknown'} file system, not hugetlbfs"
    if not os.access(real, os.W_OK | os.X_OK):
        return f"{path} is not writable by this user"
    return ""


def free_huge_bytes(path: str) -> int:
    """Bytes of huge pages the hugetlbfs mount at ``path`` can hand out now: the
    machine's free pages of its page size that no map has reserved yet, bounded by the
    mount's own size= limit. Pages of a file unlinked while still mapped count as used
    until the last map closes."""
    st = os.statvfs(path)
    page = st.f_bsize
    pool = f"/sys/kernel/mm/hugepages/hugepages-{page // 1024}kB"
    try:
        with open(f"{pool}/free_hugepages", encoding="ascii") as f:
            free = int(f.read())
        with open(f"{pool}/resv_hugepages", encoding="ascii") as f:
            free -= int(f.read())
    except (OSError, ValueError):
        free = 0
    if st.f_blocks:   # a mount with size=: its own bound
        free = min(free, st.f_bavail)
    return max(free, 0) * page


def _not_own(st: os.stat_result, is_kind: Callable[[int], bool], kind: str, mode: int) -> str:
    """Why a file is not this user's own of ``kind`` and ``mode``; "" when it is."""
    if not is_kind(st.st_mode):
        return f"it is not {kind}" + (" (a symbolic link)" if stat.S_ISLNK(st.st_mode) else "")
    if st.st_uid != os.geteuid():
        return f"it belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()})"
    if stat.S_IMODE(st.st_mode) != mode:
        return f"its mode is {stat.S_IMODE(st.st_mode):04o}, not {mode:04o}"
    return ""


def _open_own(path: str, flags: int) -> int:
    """Open a segment or spill file of this session: never through a symbolic link, and
    only a regular file of this user with mode 0600. Raises FileNotFoundError when it is
    gone (the object moved), ObjectStoreError naming path and cause otherwise."""
    try:
        fd = os.open(path, flags | _NOFOLLOW, 0o600)
    except FileNotFoundError:
        raise
    except FileExistsError as exc:
        raise ObjectStoreError(
            f"cannot create the segment {path}: a file of that name exists already. Only "
            "this session's user can write its directory, so a program of this user made "
            "it; the object was not stored (put it again).") from exc
    except OSError as exc:
        why = "it is a symbolic link" if exc.errno == errno.ELOOP else exc.strerror
        raise ObjectStoreError(f"cannot open the segment {path} ({why}); the object's data "
                               "cannot be read or written here. A segment is only ever a "
                               "file of this session's user: stop what changes files in "
                               "that directory, and put the value again.") from exc
    try:
        problem = _not_own(os.fstat(fd), stat.S_ISREG, "a regular file", 0o600)
    except OSError as exc:
        problem = exc.strerror or "fstat failed"
    if problem:
        os.close(fd)
        raise ObjectStoreError(
            f"refusing to map {path}: {problem}. A segment is only ever a file of this "
            "session's user with mode 0600: a program of this user replaced or changed it "
            "(no other user can). Stop what writes into that directory, and put the value "
            "again.")
    return fd


def allocate(path: str, cap: int, idle: Callable[[], bool]) -> bool:
    """Create a segment and write every page once (tmpfs zeroes a page at its first
    touch, ~3 ms per MiB): the first large put then writes at memcpy speed."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR | _NOFOLLOW, 0o600)
    except OSError:
        return False
    zeros = bytes(_WARM_CHUNK)
    try:
        os.ftruncate(fd, cap)
        for off in range(0, cap, _WARM_CHUNK):
            while not idle():
                time.sleep(0.05)
            # pwrite releases the GIL, unlike a populating mmap: the loop stays responsive.
            os.pwrite(fd, zeros[: min(_WARM_CHUNK, cap - off)], off)
        return True
    except OSError:
        unlink_path(path)
        return False
    finally:
        os.close(fd)


def unlink_path(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError:
        # Not a file (a directory someone made at a segment's name): its name is never
        # handed out again, and the session's directory goes with the session.
        pass


def spill_file(src: str, dst: str, size: int, offset: int = 0) -> str:
    """Copy a sealed segment (``size`` bytes at ``offset`` of ``src``) to its spill file
    in the kernel; "" or why it failed."""
    try:
        fin = os.open(src, os.O_RDONLY | _NOFOLLOW)
    except OSError as exc:
        return f"{src}: {exc.strerror}"
    try:
        fout = os.open(dst, os.O_CREAT | os.O_EXCL | os.O_WRONLY | _NOFOLLOW, 0o600)
    except OSError as exc:
        os.close(fin)
        return f"{dst}: {exc.strerror}"
    try:
        off = 0
        while off < size:
            try:
                n = os.sendfile(fout, fin, offset + off, min(size - off, 1 << 30))
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                n = _copy_read(fin, fout, offset + off, min(size - off, _WARM_CHUNK))   # hugetlbfs
            if n <= 0:
                return f"{dst}: short copy ({off} of {size} bytes)"
            off += n
        return ""
    except OSError as exc:
        return f"{dst}: {exc.strerror}"
    finally:
        os.close(fin)
        os.close(fout)


def _copy_read(fin: int, fout: int, off: int, n: int) -> int:
    """Copy ``n`` bytes at ``off`` with read() and write(): what sendfile() cannot do
    from a hugetlbfs file. The bytes written."""
    data = os.pread(fin, n, off)
    view = memoryview(data)
    done = 0
    while done < len(data):
        done += os.write(fout, view[done:])
    return done


def sweep_stale_segments(folder: str = SHM_DIR) -> int:
    """Remove this user's segment directories in ``folder`` (/dev/shm, or a hugetlbfs
    mount) of sessions whose head process is gone (the pid in the name). Returns how
    many. Another user's entries are never touched, even by root: a name says nothing
    of who made it, the owner does."""
    removed = 0
    mine = f"{DIR_PREFIX}{os.geteuid()}-"
    try:
        names = os.listdir(folder)
    except OSError:
        return 0
    for name in names:
        if not name.startswith(mine):
            continue
        try:
            pid = int(name[len(mine):].split("-", 1)[0])
        except ValueError:
            continue
        if not pid_alive(pid) and remove_private_dir(os.path.join(folder, name)):
            removed += 1
    return removed


# ---------------------------------------------------------------- writer / reader side


def open_segment(folder: str, segment: types_pb2.Segment) -> mmap.mmap:
    """A read-write map of the start of the segment the store handed out, as far as its
    object or what was allocated before reaches (never its unused slack), every page
    allocated and present. ObjectStoreError (or ObjectStoreFullError) when it cannot be
    made: the caller aborts the segment so that the store gives its bytes back."""
    path, offset = segment_file(folder, segment.name)
    size = max(segment.size, 1)
    cap = max(segment.capacity, size)
    need = min(page_align(size), cap)
    exists = segment.reused or is_slot(segment.name)   # a slot's file: the store made it
    try:
        fd = _open_own(path, os.O_RDWR if exists else os.O_CREAT | os.O_EXCL | os.O_RDWR)
    except FileNotFoundError as exc:   # the store removed it, or the session ends
        raise ObjectStoreError(f"cannot open the segment {path}: it is gone (the cluster is "
                               "shutting down, or something removed it)") from exc
    try:
        done = min(segment.allocated, cap) if segment.reused else 0
        if not exists:
            os.ftruncate(fd, cap)
            if need >= ALLOCATE_MIN and not segment.name.startswith(HUGE + "/"):
                try:
                    mm = map_allocating(fd, need)
                except OSError as exc:
                    raise no_room(size, exc) from exc
                if mm is not None:
                    return mm
        if need > done:
            try:
                # Allocate now: a full /dev/shm then fails here with ENOSPC instead of
                # killing the writer with SIGBUS in the middle of the copy.
                os.posix_fallocate(fd, offset + done, need - done)
            except OSError as exc:
                raise no_room(size, exc) from exc
        length = max(need, done)
        if segment.name.startswith(HUGE + "/"):
            length = map_length(fd, length)
        # (A slot populates as a fresh one does: on the premap thread, with the GIL
        # released, where MAP_POPULATE would hold it.)
        return map_for_writing(fd, length, fresh=not segment.reused or is_slot(segment.name),
                               offset=offset)
    except OSError as exc:
        raise ObjectStoreError(f"cannot size or map the segment {path} ({exc.strerror}); "
                               "the object was not stored.") from exc
    finally:
        os.close(fd)


def map_slab(folder: str, slot: str) -> mmap.mmap:
    """A writer's read-write map of the whole slab that slot ``slot`` is in (no page made
    present: the writer populates each slot's range as it fills it). ObjectStoreError
    when it cannot be made (gone: the store removed the slab)."""
    path = segment_file(folder, slot)[0]
    try:
        fd = _open_own(path, os.O_RDWR)
    except FileNotFoundError as exc:
        raise ObjectStoreError(f"cannot open the slab {path}: it is gone (the cluster is "
                               "shutting down, or something removed it)") from exc
    try:
        return mmap.mmap(fd, os.fstat(fd).st_size, mmap.MAP_SHARED,
                         mmap.PROT_READ | mmap.PROT_WRITE)
    except (OSError, ValueError) as exc:
        raise ObjectStoreError(f"cannot map the slab {path} ({exc}); the object was not "
                               "stored.") from exc
    finally:
        os.close(fd)


def no_room(size: int, exc: OSError) -> ObjectStoreFullError:
    return ObjectStoreFullError(
        f"/dev/shm has no room for an object of {fmt_bytes(size)} ({exc.strerror}). "
        "Free shared memory, or lower object_store_memory so the store fits in /dev/shm.")


def page_align(n: int) -> int:
    return (n + mmap.PAGESIZE - 1) & ~(mmap.PAGESIZE - 1)


def map_ahead(folder: str, name: str) -> mmap.mmap | None:
    """A read-write map of an existing segment with its pages mapped, the GIL released
    meanwhile (a populating mmap() holds it for ~0.1 s per 512 MiB); None if gone or
    not the session's own file (the put then opens it itself, and says why). Not for a
    slot: a put maps its range when it fills it."""
    if is_slot(name):
        return None
    try:
        fd = _open_own(segment_path(folder, name), os.O_RDWR)
    except (OSError, ObjectStoreError):
        return None
    try:
        size = os.fstat(fd).st_size
        if size <= 0:
            return None
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except OSError:
        return None
    finally:
        os.close(fd)
    populate_write(mm)
    return mm




def write_into(mm: mmap.mmap | memoryview, ser: Serialized) -> None:
    view = memoryview(mm)
    try:
        ser.write_into(view)
    finally:
        view.release()


def map_segment(folder: str, segment: types_pb2.Segment,
                whole: bool = False) -> tuple[mmap.mmap, memoryview]:
    """A read-only map of a sealed segment or spill file (``whole``: all of the file, for
    the later objects the segment will hold); it lives as long as views of it.
    FileNotFoundError: the object moved (spilled), ask the head where to;
    ObjectStoreError: the file is not the session's own, or cannot be mapped."""
    path, offset = (segment.path, 0) if segment.path else segment_file(folder, segment.name)
    fd = _open_own(path, os.O_RDONLY)
    try:
        if not segment.path and is_slot(segment.name):   # its range (whole: its capacity)
            length = max(segment.capacity if whole else 0, segment.size, 1)
        else:
            length = max(os.fstat(fd).st_size if whole else segment.size, segment.size, 1)
        if segment.name.startswith(HUGE + "/") and not segment.path:
            length = map_length(fd, length)
        mm = mmap.mmap(fd, length, mmap.MAP_SHARED, mmap.PROT_READ, offset=offset)
    except (OSError, ValueError) as exc:
        raise ObjectStoreError(f"cannot map {path} ({exc}); the object's data cannot be "
                               "read here.") from exc
    finally:
        os.close(fd)
    return mm, memoryview(mm)[: segment.size]
