"""`gs://` model repositories (Google Cloud Storage): Triton's path grammar and credentials,
objects through google-cloud-storage.

Paths: `gs://bucket[/path]`. Repeated, leading and trailing slashes are dropped, as for `s3://`.
The endpoint is Google's, or the emulator's or private one that `STORAGE_EMULATOR_HOST` names
(honoured by google-cloud-storage itself; requests there are anonymous unless a credential file
is given).

Credentials, as Triton: with TRITON_CLOUD_CREDENTIAL_PATH, the "gs" entry of that JSON file whose
name is the longest prefix of the path: the path of a credentials JSON file (an authorized user's
or a service account's); without it, GOOGLE_APPLICATION_CREDENTIALS. No file at all: the library's
default chain (gcloud's application default credentials, the attached service account), and
anonymous access (a public bucket) when that finds nothing.

google-cloud-storage is imported on first use: it is the optional extra `modelhost[gcs]`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from dataclasses import dataclass
from typing import Any, BinaryIO, Iterator, Mapping

from host.errors import HostError, InvalidArgumentError, UnavailableError
from host.storage import cloud
from host.storage.cloud import (CONNECT_TIMEOUT_S, CREDENTIAL_FILE_VARIABLE, READ_TIMEOUT_S, CloudStore, first_line,
                                path_parts)
from host.storage.mirror import RemoteObject

log = logging.getLogger("host.storage")

PREFIX = "gs://"
MOUNT_DIRECTORY_VARIABLE = "TRITON_GCS_MOUNT_DIRECTORY"
CREDENTIALS_VARIABLE = "GOOGLE_APPLICATION_CREDENTIALS"
EMULATOR_VARIABLE = "STORAGE_EMULATOR_HOST"
SCOPES = ("https://www.googleapis.com/auth/devstorage.read_only",)
RETRY_DEADLINE_S = 10  # transient failures are retried with back-off for this long, then fail
_BUCKET = re.compile(r"[0-9a-z][0-9a-z._-]{1,220}[0-9a-z]")  # Google's bucket names


@dataclass(frozen=True)
class GSPath:
    url: str  # as the user wrote it: what messages show
    bucket: str
    prefix: str  # without leading or trailing '/'; "" for the bucket's root


def parse(path: str) -> GSPath:
    """Bucket and path of a `gs://` path; InvalidArgumentError when malformed."""
    parts = path_parts(path.removeprefix(PREFIX))
    if not parts:  # Triton's text
        raise InvalidArgumentError(f"No bucket name found in path: {path}")
    if not _BUCKET.fullmatch(parts[0]):
        raise InvalidArgumentError(f"Invalid bucket name: '{parts[0]}' in model repository '{path}'")
    return GSPath(path, parts[0], "/".join(parts[1:]))


def credential_file(path: str, environ: Mapping[str, str] | None = None) -> str:
    """The credentials JSON file for `path`: TRITON_CLOUD_CREDENTIAL_PATH's "gs" entry (the longest
    name the path starts with), else GOOGLE_APPLICATION_CREDENTIALS; "" for none."""
    environ = os.environ if environ is None else environ
    entry = cloud.credential_entry("gs", path, environ)
    if entry is None:
        return environ.get(CREDENTIALS_VARIABLE, "")
    if not isinstance(entry, str):
        raise InvalidArgumentError(f"{CREDENTIAL_FILE_VARIABLE}: the gs entry for {path} is not the "
                                   "path of a credentials file")
    return entry


class GCSStore(CloudStore):
    """The objects of one `gs://` repository."""

    def __init__(self, path: str) -> None:
        self.where = parse(path)
        super().__init__(path, self.where.bucket, self.where.prefix)
        self.endpoint = os.environ.get(EMULATOR_VARIABLE) or "https://storage.googleapis.com"
        self._retry: Any = None

    def make_client(self) -> Any:
        storage = cloud.require("google.cloud.storage", "gs", "google-cloud-storage", "gcs")
        from google.cloud.storage.retry import DEFAULT_RETRY

        with self._errors():
            credentials, project = self._credentials()
            client = storage.Client(project=project or "<none>", credentials=credentials)
        self._retry = DEFAULT_RETRY.with_delay(initial=0.5, maximum=2.0).with_timeout(RETRY_DEADLINE_S)
        return client

    def _credentials(self) -> tuple[Any, str | None]:
        """(credentials, project) as Triton picks them; None credentials: anonymous."""
        import google.auth
        from google.auth.credentials import AnonymousCredentials
        from google.auth.exceptions import DefaultCredentialsError

        file = credential_file(self.url)
        if file:
            try:
                return google.auth.load_credentials_from_file(file, scopes=SCOPES)
            except DefaultCredentialsError as exc:
                raise UnavailableError(f"{self.failure}: cannot use the Google credentials in '{file}': "
                                       f"{first_line(exc)}") from None
        if os.environ.get(EMULATOR_VARIABLE):
            return AnonymousCredentials(), None
        try:
            return google.auth.default(scopes=SCOPES)
        except DefaultCredentialsError:
            log.info("model repository '%s': no Google credentials found: reading it anonymously "
                     "(a public bucket)", self.url)
            return AnonymousCredentials(), None

    @contextlib.contextmanager
    def _errors(self, key: str | None = None) -> Iterator[None]:
        """google-cloud-storage's exceptions as the host's errors, naming the repository as given."""
        import requests
        from google.api_core import exceptions as gx
        from google.auth import exceptions as ax

        where = self.failure
        try:
            yield
        except HostError:
            raise
        except gx.RetryError as exc:  # the retries' deadline passed: say what the last try met
            cause = exc.cause
            if isinstance(cause, requests.RequestException | ax.TransportError | ConnectionError):
                raise UnavailableError(f"{where}: cannot reach {self.endpoint}: {first_line(cause)}") from None
            raise UnavailableError(f"{where}: {first_line(cause or exc)}") from None
        except gx.NotFound as exc:
            if key is None:
                raise self.missing_container() from None
            raise UnavailableError(f"{where}: object '{self.key_prefix + key}': {first_line(exc)}") from None
        except (gx.Forbidden, gx.Unauthorized, ax.RefreshError) as exc:
            raise UnavailableError(f"{where}: access denied ({first_line(exc)}); check the credentials") from None
        except (requests.RequestException, ax.TransportError) as exc:
            raise UnavailableError(f"{where}: cannot reach {self.endpoint}: {first_line(exc)}") from None
        except (gx.GoogleAPICallError, ax.GoogleAuthError, ValueError) as exc:
            raise UnavailableError(f"{where}: {first_line(exc)}") from None

    def _timeout(self) -> tuple[int, int]:
        return (CONNECT_TIMEOUT_S, READ_TIMEOUT_S)

    def list(self) -> list[RemoteObject]:
        client, prefix = self.client(), self.key_prefix
        out = []
        with self._errors():
            for blob in client.list_blobs(self.container, prefix=prefix, timeout=self._timeout(),
                                          retry=self._retry):
                key = blob.name[len(prefix):]
                if key:  # the prefix's own folder marker is not in it
                    # the generation changes whenever the object is written again
                    etag = f"{blob.generation}:{blob.etag or blob.md5_hash or ''}"
                    out.append(RemoteObject(key, int(blob.size or 0), etag, cloud.mtime_ns(blob.updated)))
        return out

    def download(self, key: str, into: BinaryIO) -> None:
        client = self.client()
        with self._errors(key):
            blob = client.bucket(self.container).blob(self.key_prefix + key)
            blob.download_to_file(into, timeout=self._timeout(), retry=self._retry)

    def any_object(self) -> bool:
        client = self.client()
        with self._errors():
            blobs = client.list_blobs(self.container, prefix=self.key_prefix, max_results=1,
                                      timeout=self._timeout(), retry=self._retry)
            return any(True for _ in blobs)


Store = GCSStore
