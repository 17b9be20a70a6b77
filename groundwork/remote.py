"""Run folders on a filesystem URI (`storage.path: s3://bucket/runs`, gs://, hdfs://, file://): whatever
pyarrow's filesystems open. A run works in a local staging folder of the same name on each node (the driver's
files, each rank's log) and copies it to the URI; checkpoints go there through Ray Train (its storage_path is
the URI) and come back, one at a time, newest first, when a run resumes. Every URI, file:// included, takes
this same path, so a test on file:// runs the code an s3:// bucket does."""

from __future__ import annotations

import functools
import hashlib
import logging
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.fs as pafs

from groundwork.errors import ConfigError

log = logging.getLogger(__name__)
NOT_COPIED = ("checkpoint_", ".staging", ".fetched", ".partial")  # Ray Train's to upload, or scratch


def is_uri(path: str) -> bool:
    return "://" in path


def is_node_local(uri: str) -> bool:
    """A file:// URI: a folder of each node's own, read without a network (unlike a bucket every node reaches)."""
    return uri.startswith("file://")


SCHEMES = ("s3", "gs", "gcs", "hdfs", "viewfs", "file", "abfs", "abfss")  # what pyarrow's from_uri opens
CONFIG_HELP = "give a folder, or a URI such as s3://bucket/runs, gs://bucket/runs, hdfs://host/runs or file:///mnt/runs"


def check_scheme(uri: str) -> None:
    """A URI pyarrow has a filesystem for, checked without opening it (opening an s3:// one asks the network for
    its region): one line otherwise."""
    scheme = uri.split("://", 1)[0]  # as pyarrow reads it: S3:// is not s3://
    if scheme not in SCHEMES:
        raise ConfigError(f"storage.path {uri}: pyarrow has no {scheme}:// filesystem: {CONFIG_HELP}")


def open_uri(uri: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem and the path within it: one line for a URI pyarrow cannot parse; the storage's own OSError
    (no network, no credentials) for one it cannot reach, for the caller to say so."""
    try:
        return _from_uri(uri)
    except ValueError as exc:  # pyarrow's ArrowInvalid: not a URI it can parse
        raise ConfigError(f"storage.path {uri}: pyarrow cannot open it ({exc}): {CONFIG_HELP}") from None


@functools.lru_cache(maxsize=64)
def _from_uri(uri: str) -> tuple[pafs.FileSystem, str]:
    """Opened once per URI and process: a run pushes to the same URIs again and again, and opening an s3://
    URI that names no region asks S3 for the bucket's region each time (an error is not kept)."""
    return pafs.FileSystem.from_uri(uri)


def join(uri: str, *parts: str) -> str:
    """`parts` under `uri`, its query (s3://b/runs?endpoint_override=host:9000) kept at the end."""
    base, _, query = uri.partition("?")
    joined = "/".join([base.rstrip("/"), *parts])
    return f"{joined}?{query}" if query else joined


def split(uri: str) -> tuple[str, str]:
    """(the parent URI, the last name): s3://b/runs/r1?region=x -> (s3://b/runs?region=x, r1)."""
    base, _, query = uri.partition("?")
    parent, name = base.rstrip("/").rsplit("/", 1)
    return (f"{parent}?{query}" if query else parent), name


def staging_for(uri: str) -> Path:
    """The local folder that stands for `uri` on every node (the same path on each: it depends only on the URI)."""
    digest = hashlib.sha1(uri.encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / "orchestrator-storage" / digest


def exists(uri: str) -> bool:
    fs, path = open_uri(uri)
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def probe(uri: str) -> None:
    """Create `uri` as a folder and write and delete a file in it: an error now, not after the run trained."""
    fs, path = open_uri(uri)
    fs.create_dir(path, recursive=True)
    marker = f"{path.rstrip('/')}/.orchestrator-probe"
    with fs.open_output_stream(marker) as out:
        out.write(b"ok")
    fs.delete_file(marker)


def _copied(name: str) -> bool:
    return not name.startswith(NOT_COPIED)


def stamps(local: Path) -> dict[str, int]:
    """Each file's modification time (ns) under `local`, by relative path."""
    return {p.relative_to(local).as_posix(): p.stat().st_mtime_ns for p in local.rglob("*") if p.is_file()}


def upload(local: Path, uri: str, unchanged: dict[str, int] | None = None) -> None:
    """The run's own files under `local` (not checkpoints, not scratch) to `uri`, file by file; not those
    whose modification time is still the one in `unchanged` (copies this node made of what the URI holds: a
    rank on another node may have written a newer one there since)."""
    fs, base = open_uri(uri)
    unchanged = unchanged or {}
    for relative, stamp in sorted(stamps(local).items()):
        if all(_copied(part) for part in relative.split("/")) and unchanged.get(relative) != stamp:
            upload_file(local / relative, fs, f"{base.rstrip('/')}/{relative}")


def upload_file(file: Path, fs: pafs.FileSystem, dest: str) -> None:
    fs.create_dir(dest.rsplit("/", 1)[0], recursive=True)
    pafs.copy_files(str(file), dest, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)


def download(uri: str, local: Path) -> None:
    """The run's own files at `uri` (not its checkpoints) into `local`."""
    fs, base = open_uri(uri)
    selector = pafs.FileSelector(base, recursive=True)
    for info in fs.get_file_info(selector):
        relative = info.path[len(base.rstrip("/")) + 1:]
        if info.type == pafs.FileType.File and all(_copied(part) for part in relative.split("/")):
            dest = local / relative
            dest.parent.mkdir(parents=True, exist_ok=True)
            pafs.copy_files(info.path, str(dest), source_filesystem=fs, destination_filesystem=pafs.LocalFileSystem())


def checkpoint_names(uri: str) -> list[str]:
    """The checkpoint folders of the run at `uri`, newest first (their names sort by time or number)."""
    fs, base = open_uri(uri)
    try:
        found = fs.get_file_info(pafs.FileSelector(base))
    except FileNotFoundError:
        return []
    names = (info.base_name for info in found if info.type == pafs.FileType.Directory)
    return sorted((n for n in names if n.startswith("checkpoint_")), reverse=True)


def fetch(uri: str, name: str, dest: Path) -> None:
    """The run's checkpoint folder `name` copied to `dest` (emptied first)."""
    fs, base = open_uri(uri)
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    pafs.copy_files(f"{base.rstrip('/')}/{name}", str(dest), source_filesystem=fs,
                    destination_filesystem=pafs.LocalFileSystem())


def remove(uri: str) -> None:
    fs, path = open_uri(uri)
    fs.delete_dir(path)


@dataclass(frozen=True)
class RunPlace:
    """Where one run lives. `local` is the folder everything is written to; where storage is a URI it is a
    staging copy, and `uri` the run folder there (None for a plain path)."""

    local: Path
    uri: str | None = None
    pulled: dict[str, int] = field(default_factory=dict, compare=False)  # what start() copied, as it was

    @classmethod
    def of(cls, storage: str, name: str) -> RunPlace:
        if is_uri(storage):
            return cls(staging_for(storage) / name, join(storage, name))
        return cls(Path(storage) / name)

    @classmethod
    def at(cls, where: str) -> RunPlace:
        """The place `where` (as `where` says it) names."""
        if is_uri(where):
            return cls.of(*split(where))
        return cls(Path(where))

    @property
    def where(self) -> str:
        return self.uri or str(self.local)

    def has(self, file: str) -> bool:
        return exists(join(self.uri, file)) if self.uri else (self.local / file).exists()

    def read(self, file: str) -> bytes:
        if self.uri is None:
            return (self.local / file).read_bytes()
        fs, path = open_uri(join(self.uri, file))
        with fs.open_input_stream(path) as stream:
            return stream.read()

    def move(self, file: str, to: str) -> None:
        """Rename a file of the run (on a URI, there and in the staging copy)."""
        if (self.local / file).exists():
            (self.local / file).replace(self.local / to)
        if self.uri is not None:
            fs, path = open_uri(join(self.uri, file))
            fs.move(path, open_uri(join(self.uri, to))[1])

    def start(self, resume: bool) -> None:
        """A fresh staging copy: empty, or for a resumed run its files (not its checkpoints) from the URI."""
        if self.uri is None:
            return
        shutil.rmtree(self.local, ignore_errors=True)  # an earlier run's copy under this name
        self.local.mkdir(parents=True)
        if resume:
            download(self.uri, self.local)
            self.pulled.update(stamps(self.local))

    def push(self) -> None:
        """The run's files from the staging copy to the URI (a plain path: they are there already)."""
        if self.uri is not None:
            upload(self.local, self.uri, self.pulled)

    def push_after_failure(self) -> None:
        """push, where the run already failed: a storage that fails too is named, not raised over the run's
        own error."""
        try:
            self.push()
        except OSError as exc:
            log.warning("the run's files stay in %s: copying them to %s failed (%s)", self.local, self.uri, exc)

    def checkpoints(self) -> list[str]:
        """The run's checkpoint folders, newest first, by name."""
        if self.uri is not None:
            return checkpoint_names(self.uri)
        return sorted((p.name for p in self.local.glob("checkpoint_*") if p.is_dir()), reverse=True)

    def remove(self) -> None:
        shutil.rmtree(self.local, ignore_errors=True)
        if self.uri is not None:
            try:
                remove(self.uri)
            except OSError as exc:  # the run's own error is the one to raise
                log.warning("%s could not be removed (%s)", self.uri, exc)

    def local_checkpoint(self, path: str) -> Path | None:
        """A checkpoint Ray Train stored, as a path on this machine: itself for a folder or file://; None for a
        bucket (it is under `uri`)."""
        if self.uri is None or is_node_local(self.uri):
            return Path(path)
        return None
