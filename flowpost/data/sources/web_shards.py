"""Source ``webdataset``: existing ``.tar`` shards, local or at any fsspec URL, read as a stream.

A sample is the run of consecutive members sharing a key (the member path up to the first dot of its
file name); its image is the first member whose extension is in ``image_keys``, its caption the
first in ``caption_keys`` (a ``.json`` member's caption field; its other fields become metadata).
Only image, ``.txt``, ``.json`` and ``.npy`` members are read (arrays with ``allow_pickle=False``);
every other member, a pickle above all, is skipped unread.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
from collections.abc import Iterator
from pathlib import PurePosixPath
from typing import Any

from braceexpand import braceexpand

from flowpost.core.config.schema.captioned import WebShardsDataset
from flowpost.core.io import sha256_file
from flowpost.data.sources.base import CaptionedSource
from flowpost.data.sources.items import SourceItem, caption_field, json_metadata
from flowpost.errors import FlowpostError, TransientError

DVC_SCHEMES = ("s3", "gs", "azure", "hdfs", "webhdfs", "http", "https", "ssh")  # what DVC reads as external deps


class WebShardsSource(CaptionedSource[WebShardsDataset]):
    """Reads a ``webdataset`` dataset."""

    def items(self, *, where: str) -> Iterator[SourceItem]:
        c, at = self.config, f"{where}.shards"
        keys = {"image_keys": c.image_keys, "caption_keys": c.caption_keys}
        return shard_items(shard_urls(c.shards, where=at), **keys, caption_column=c.caption_column, where=at)

    def fingerprint(self, *, where: str) -> str:
        at = f"{where}.shards"
        return shards_fingerprint(shard_urls(self.config.shards, where=at), where=at)

    def dependencies(self, *, where: str) -> list[str]:
        return shard_dependencies(shard_urls(self.config.shards, where=f"{where}.shards"))

    def location(self) -> str:
        shards = self.config.shards
        return shards if isinstance(shards, str) else ", ".join(shards)


def shard_urls(shards: str | list[str], *, where: str) -> list[str]:
    """Every shard a pattern or list names, brace patterns expanded, in order."""
    patterns = [shards] if isinstance(shards, str) else shards
    urls = [url for pattern in patterns for url in braceexpand(pattern)]
    if len(set(urls)) != len(urls):
        raise FlowpostError("a shard is named twice; list each once", where=where)
    return urls


def shards_fingerprint(urls: list[str], *, where: str) -> str:
    """Hash of each shard's URL and state: a local file's contents, a remote object's listing (size, ETag,
    modification time) as its filesystem reports it."""
    digest = hashlib.sha256()
    for url in urls:
        fs, path = _filesystem(url, where=where)
        try:
            state = sha256_file(path) if _is_local(fs) else fs.ukey(path)
        except FileNotFoundError:
            raise FlowpostError(f"shard {url} does not exist; fix shards or create it", where=where) from None
        except OSError as exc:
            raise TransientError(f"shard {url} could not be reached ({exc}); retry", where=where) from None
        digest.update(f"{url}\0{state}\n".encode())
    return digest.hexdigest()


def shard_dependencies(urls: list[str]) -> list[str]:
    """What DVC can track of the shards: local paths, and URLs of the remote storages DVC reads."""
    import fsspec

    deps = []
    for url in urls:
        fs, path = fsspec.core.url_to_fs(url)
        if _is_local(fs):
            deps.append(url.removeprefix("file://"))
        elif url.partition("://")[0] in DVC_SCHEMES:
            deps.append(url)
    return deps


def shard_items(
    urls: list[str], *, image_keys: list[str], caption_keys: list[str], caption_column: str | None, where: str
) -> Iterator[SourceItem]:
    """One item per sample, named ``<shard file>/<key>``; an unreadable shard is a FlowpostError naming it."""
    wanted = {key.lower() for key in (*image_keys, *caption_keys)}
    for url in urls:
        shard = PurePosixPath(url.partition("://")[2] or url).name
        for key, members in _samples(url, wanted, where=where):
            yield _item(f"{shard}/{key}", f"{url}: {key}", members, image_keys, caption_keys, caption_column)


def _samples(url: str, wanted: set[str], *, where: str) -> Iterator[tuple[str, dict[str, bytes]]]:
    """(key, extension -> bytes of the wanted members) per sample, streamed from the shard."""
    fs, path = _filesystem(url, where=where)
    key, members, count = None, {}, 0
    try:
        with fs.open(path, "rb") as handle, tarfile.open(fileobj=handle, mode="r|*") as tar:
            for member in tar:
                if not member.isfile():
                    continue
                folder, _, name = member.name.rpartition("/")
                stem, _, ext = name.partition(".")
                sample = f"{folder}/{stem}" if folder else stem
                if sample != key and key is not None:
                    yield key, members
                    count += 1
                    members = {}
                key = sample
                if ext.lower() in wanted:
                    reader = tar.extractfile(member)
                    assert reader is not None
                    members[ext.lower()] = reader.read()
    except FileNotFoundError:
        raise FlowpostError(f"shard {url} does not exist; fix shards or create it", where=where) from None
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise FlowpostError(
            f"shard {url} is not a readable tar archive after {count} samples ({exc}); replace or remove it",
            where=where,
        ) from None
    if key is not None:
        yield key, members


def _item(
    name: str,
    where: str,
    members: dict[str, bytes],
    image_keys: list[str],
    caption_keys: list[str],
    caption_column: str | None,
) -> SourceItem:
    image = next((members[k.lower()] for k in image_keys if k.lower() in members), b"")
    fields = _json_fields(members)
    caption_key = next((k.lower() for k in caption_keys if k.lower() in members), None)
    caption: Any = None
    if caption_key is not None and (caption_key.rpartition(".")[2] != "json" or not _is_utf8(members[caption_key])):
        caption = members[caption_key]  # text, or JSON that is not UTF-8 (counted as such)
    elif caption_key is not None:
        column, caption = caption_field(fields, caption_column)
        fields = {k: v for k, v in fields.items() if k != column}
    return SourceItem(name, where, image, caption, json_metadata(fields))


def _json_fields(members: dict[str, bytes]) -> dict[str, Any]:
    """The fields of the sample's first ``.json`` member holding an object; none when there is no such member."""
    for ext, data in members.items():
        if ext.rpartition(".")[2] == "json":
            try:
                value = json.loads(data)
            except ValueError:
                continue
            if isinstance(value, dict):
                return value
    return {}


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _filesystem(url: str, *, where: str) -> tuple[Any, str]:
    import fsspec

    try:
        return fsspec.core.url_to_fs(url)
    except (ValueError, ImportError) as exc:
        raise FlowpostError(f"no filesystem for shard {url} ({exc}); install its fsspec backend", where=where) from None


def _is_local(fs: Any) -> bool:
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else fs.protocol
    return "file" in protocols
