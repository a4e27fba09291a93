"""`s3://` model repositories: Triton's path grammar and credentials, objects through boto3.

Paths (Triton's S3 file system): `s3://bucket[/prefix]`, or `s3://host:port/bucket[/prefix]` for
an S3-compatible endpoint (MinIO, ...), reached over HTTP unless written
`s3://https://host:port/...` (`s3://http://host:port/...` says HTTP explicitly). Repeated, leading
and trailing slashes are dropped. Without host:port, boto3 picks the AWS endpoint and region.

Credentials: with TRITON_CLOUD_CREDENTIAL_PATH, the "s3" entry of that JSON file whose name is the
longest prefix of the path (Triton's rule): key_id and secret_key (with session_token and region),
else profile, else boto3's own chain; without it, boto3's own chain (AWS_ACCESS_KEY_ID and
AWS_SECRET_ACCESS_KEY, AWS_PROFILE, ~/.aws/..., instance roles).

boto3 is imported on first use: it is the optional extra `modelhost[s3]`.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import Any, BinaryIO, Iterator, Mapping

from host.errors import HostError, InvalidArgumentError, UnavailableError
from host.storage import cloud
from host.storage.cloud import (CONNECT_TIMEOUT_S, CREDENTIAL_FILE_VARIABLE, MAX_ATTEMPTS, READ_TIMEOUT_S,
                                CloudStore, path_parts)
from host.storage.mirror import RemoteObject

PREFIX = "s3://"
MOUNT_DIRECTORY_VARIABLE = "TRITON_AWS_MOUNT_DIRECTORY"
_HOST_PORT = re.compile(r"[0-9a-zA-Z\-.]+:[0-9]+")
_BUCKET = re.compile(r"[0-9a-zA-Z.\-_]{1,255}")  # what boto3 accepts


@dataclass(frozen=True)
class S3Path:
    url: str  # as the user wrote it: what messages show
    bucket: str
    prefix: str  # without leading or trailing '/'; "" for the bucket's root
    endpoint: str | None  # "http://host:port" for an S3-compatible store; None: AWS's


def clean(path: str) -> str:
    """Triton's CleanPath: `s3://`, an optional `http://` or `https://`, then the rest without
    leading, trailing or repeated slashes."""
    rest, out = path.removeprefix(PREFIX), PREFIX
    for protocol in ("https://", "http://"):
        if rest.startswith(protocol):
            rest, out = rest[len(protocol):], out + protocol
            break
    parts = path_parts(rest)
    if not parts:
        raise InvalidArgumentError(f"Invalid bucket name: '{rest}'")
    return out + "/".join(parts)


def parse(path: str) -> S3Path:
    """Bucket, prefix and endpoint of an `s3://` path; InvalidArgumentError when malformed."""
    cleaned = clean(path)
    rest = cleaned.removeprefix(PREFIX)
    protocol = next((p for p in ("https://", "http://") if rest.startswith(p)), "")
    parts = rest[len(protocol):].split("/")
    endpoint = None
    if _HOST_PORT.fullmatch(parts[0]):
        endpoint = (protocol or "http://") + parts[0]
        parts = parts[1:]
        if not parts:
            raise InvalidArgumentError(f"No bucket name found in path: {path}")
    elif protocol:
        raise InvalidArgumentError(f"model repository '{path}': {protocol} must be followed by "
                                   "host:port, as in s3://https://host:port/bucket/path")
    if not _BUCKET.fullmatch(parts[0]):
        raise InvalidArgumentError(f"Invalid bucket name: '{parts[0]}' in model repository '{path}'")
    return S3Path(path, parts[0], "/".join(parts[1:]), endpoint)


def credential(path: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """boto3 Session arguments for `path` from TRITON_CLOUD_CREDENTIAL_PATH's "s3" entries (the
    longest name the path starts with), or {} for boto3's own chain."""
    entry = cloud.credential_entry("s3", path, environ)
    if entry is None:
        return {}
    found = cloud.credential_fields("s3", path, entry)
    if found.get("key_id") and found.get("secret_key"):
        out = {"aws_access_key_id": found["key_id"], "aws_secret_access_key": found["secret_key"]}
        if found.get("session_token"):
            out["aws_session_token"] = found["session_token"]
        if found.get("region"):
            out["region_name"] = found["region"]
        return out
    if found.get("profile"):
        return {"profile_name": found["profile"]}
    return {}


class S3Store(CloudStore):
    """The objects of one `s3://` repository."""

    def __init__(self, path: str) -> None:
        self.where = parse(path)
        super().__init__(path, self.where.bucket, self.where.prefix)

    def make_client(self) -> Any:
        boto3 = cloud.require("boto3", "s3", "boto3", "s3")
        from botocore.config import Config

        with self._errors():
            session = boto3.session.Session(**credential(self.url))
            config = Config(connect_timeout=CONNECT_TIMEOUT_S, read_timeout=READ_TIMEOUT_S,
                            retries={"max_attempts": MAX_ATTEMPTS, "mode": "standard"},
                            # a custom endpoint is addressed by path, as Triton does
                            s3={"addressing_style": "path"} if self.where.endpoint else None)
            region = session.region_name or ("us-east-1" if self.where.endpoint else None)
            return session.client("s3", endpoint_url=self.where.endpoint, region_name=region,
                                  config=config)

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        """boto3's exceptions as the host's errors, naming the repository as the user gave it."""
        from botocore import exceptions as bx

        where = self.failure
        try:
            yield
        except HostError:
            raise
        except bx.ClientError as exc:
            error = exc.response.get("Error", {})
            code, message = error.get("Code", "?"), error.get("Message", "")
            if code in ("NoSuchBucket", "404"):
                raise self.missing_container() from None
            if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403",
                        "ExpiredToken", "InvalidToken"):
                raise UnavailableError(f"{where}: access denied ({code}: {message}); check the "
                                       f"credentials") from None
            raise UnavailableError(f"{where}: {code}: {message}") from None
        except bx.NoCredentialsError:
            raise UnavailableError(
                f"{where}: no AWS credentials found: set AWS_ACCESS_KEY_ID and "
                f"AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, or {CREDENTIAL_FILE_VARIABLE}") from None
        except (bx.EndpointConnectionError, bx.ConnectTimeoutError, bx.ReadTimeoutError,
                bx.ConnectionClosedError) as exc:
            endpoint = self.where.endpoint or "the AWS S3 endpoint"
            raise UnavailableError(f"{where}: cannot reach {endpoint}: {exc}") from None
        except (bx.BotoCoreError, ValueError) as exc:
            raise UnavailableError(f"{where}: {exc}") from None

    def list(self) -> list[RemoteObject]:
        client, prefix = self.client(), self.key_prefix
        out = []
        with self._errors():
            pages = client.get_paginator("list_objects_v2").paginate(Bucket=self.where.bucket,
                                                                      Prefix=prefix)
            for page in pages:
                for item in page.get("Contents", ()):
                    key = item["Key"][len(prefix):]
                    if key:  # the prefix's own folder marker is not in it
                        out.append(RemoteObject(key, int(item["Size"]), item.get("ETag", "").strip('"'),
                                                cloud.mtime_ns(item["LastModified"])))
        return out

    def download(self, key: str, into: BinaryIO) -> None:
        client = self.client()
        with self._errors():
            body = client.get_object(Bucket=self.where.bucket, Key=self.key_prefix + key)["Body"]
            try:
                for chunk in body.iter_chunks(cloud.CHUNK):
                    into.write(chunk)
            finally:
                body.close()

    def any_object(self) -> bool:
        client = self.client()
        with self._errors():
            page = client.list_objects_v2(Bucket=self.where.bucket, Prefix=self.key_prefix,
                                          MaxKeys=1)
        return bool(page.get("Contents"))


Store = S3Store
