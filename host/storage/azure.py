"""`as://` model repositories (Azure Blob Storage): Triton's path grammar and credentials, blobs
through azure-storage-blob.

Paths (Triton's grammar): `as://account/container[/path]`; the account may be written as its host,
`account.blob.core.windows.net`. Anything from a `?` on is ignored, as Triton does; repeated and
trailing slashes in the path are dropped.

Credentials, as Triton: with TRITON_CLOUD_CREDENTIAL_PATH, the "as" entry of that JSON file whose
name is the longest prefix of the path (account_str, account_key, auth_type, client_id); without
it, AZURE_STORAGE_ACCOUNT, AZURE_STORAGE_KEY, AZURE_STORAGE_AUTH_TYPE and AZURE_STORAGE_CLIENT_ID.
A given account replaces the path's. auth_type "managed_identity" (with client_id for a
user-assigned identity) or "default" (DefaultAzureCredential) take their token from azure-identity;
else an account key signs the requests (Shared Key); else they are anonymous (a public container).

The endpoint is `https://<account>.blob.core.windows.net`, or modelhost's own
MODELHOST_AZURE_BLOB_ENDPOINT: a URL in which `{account}` stands for the account (Azurite:
`http://127.0.0.1:10000/{account}`; a sovereign cloud: `https://{account}.blob.core.chinacloudapi.cn`).

azure-storage-blob is imported on first use: it is the optional extra `modelhost[azure]`.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from typing import Any, BinaryIO, Iterator, Mapping

from host.errors import HostError, InvalidArgumentError, UnavailableError
from host.storage import cloud
from host.storage.cloud import CONNECT_TIMEOUT_S, MAX_ATTEMPTS, READ_TIMEOUT_S, CloudStore, first_line, path_parts
from host.storage.mirror import RemoteObject

PREFIX = "as://"
MOUNT_DIRECTORY_VARIABLE = "TRITON_AZURE_MOUNT_DIRECTORY"
ENDPOINT_VARIABLE = "MODELHOST_AZURE_BLOB_ENDPOINT"
DEFAULT_ENDPOINT = "https://{account}.blob.core.windows.net"
HOST_SUFFIX = ".blob.core.windows.net"
AUTH_TYPES = ("", "key", "managed_identity", "default")
_PATH = re.compile(r"as://([^/]+)/([^/?]+)(?:/([^?]*))?(\?.*)?")  # Triton's grammar
_ACCOUNT = re.compile(r"[0-9A-Za-z-]{1,63}")


@dataclass(frozen=True)
class ASPath:
    url: str  # as the user wrote it: what messages show
    account: str  # from the path; a credential's account_str replaces it
    container: str
    prefix: str  # without leading or trailing '/'; "" for the container's root


def parse(path: str) -> ASPath:
    """Account, container and path of an `as://` path; InvalidArgumentError when malformed."""
    match = _PATH.fullmatch(path)
    if match is None:  # Triton's text
        raise InvalidArgumentError(f"Invalid azure storage path: {path}")
    host, container, rest = match.group(1), match.group(2), match.group(3) or ""
    account = host.removesuffix(HOST_SUFFIX)
    _check_account(account, path)
    return ASPath(path, account, container, "/".join(path_parts(rest)))


def _check_account(account: str, path: str) -> None:
    if not _ACCOUNT.fullmatch(account):  # it becomes part of the endpoint's host name
        raise InvalidArgumentError(f"Invalid storage account name: '{account}' in model repository '{path}'")


@dataclass(frozen=True)
class AzureCredential:
    account: str  # "" for the path's
    key: str
    auth_type: str  # one of AUTH_TYPES
    client_id: str  # a user-assigned managed identity's


def credential(path: str, environ: Mapping[str, str] | None = None) -> AzureCredential:
    """The credential for `path`: TRITON_CLOUD_CREDENTIAL_PATH's "as" entry (the longest name the
    path starts with), else the AZURE_STORAGE_* variables."""
    environ = os.environ if environ is None else environ
    entry = cloud.credential_entry("as", path, environ)
    if entry is None:
        fields = {"account_str": environ.get("AZURE_STORAGE_ACCOUNT", ""),
                  "account_key": environ.get("AZURE_STORAGE_KEY", ""),
                  "auth_type": environ.get("AZURE_STORAGE_AUTH_TYPE", ""),
                  "client_id": environ.get("AZURE_STORAGE_CLIENT_ID", "")}
    else:
        fields = cloud.credential_fields("as", path, entry)
    found = AzureCredential(fields.get("account_str", ""), fields.get("account_key", ""),
                            fields.get("auth_type", ""), fields.get("client_id", ""))
    if found.auth_type not in AUTH_TYPES:
        raise InvalidArgumentError(f"model repository '{path}': unknown Azure auth_type "
                                   f"'{found.auth_type}': use key, managed_identity or default")
    return found


class AzureStore(CloudStore):
    """The blobs of one `as://` repository."""

    kind = "container"

    def __init__(self, path: str) -> None:
        self.where = parse(path)
        super().__init__(path, self.where.container, self.where.prefix)
        self.endpoint = ""  # the account's blob service URL, once the client is made

    def make_client(self) -> Any:
        """The container's client (azure.storage.blob.ContainerClient)."""
        blob = cloud.require("azure.storage.blob", "as", "azure-storage-blob", "azure")
        found = credential(self.url)
        account = found.account or self.where.account
        _check_account(account, self.url)
        template = os.environ.get(ENDPOINT_VARIABLE) or DEFAULT_ENDPOINT
        self.endpoint = template.replace("{account}", account).rstrip("/")
        with self._errors():
            service = blob.BlobServiceClient(
                self.endpoint, credential=self._token(found, account),
                connection_timeout=CONNECT_TIMEOUT_S, read_timeout=READ_TIMEOUT_S,
                retry_policy=blob.LinearRetry(backoff=1, random_jitter_range=0.5,
                                              retry_total=MAX_ATTEMPTS - 1))
            return service.get_container_client(self.container)

    def _token(self, found: AzureCredential, account: str) -> Any:
        """What signs the requests, as Triton picks it; None: anonymous."""
        if found.auth_type in ("managed_identity", "default"):
            identity = cloud.require("azure.identity", "as", "azure-identity", "azure")
            if found.auth_type == "default":
                return identity.DefaultAzureCredential()
            return identity.ManagedIdentityCredential(client_id=found.client_id or None)
        if found.key:
            return {"account_name": account, "account_key": found.key}
        return None

    @contextlib.contextmanager
    def _errors(self, key: str | None = None) -> Iterator[None]:
        """azure-core's exceptions as the host's errors, naming the repository as the user gave it."""
        from azure.core import exceptions as zx

        where = self.failure
        try:
            yield
        except HostError:
            raise
        except zx.ResourceNotFoundError as exc:
            if key is None or _code(exc) == "ContainerNotFound":
                raise self.missing_container() from None
            raise UnavailableError(f"{where}: blob '{self.key_prefix + key}': {first_line(exc)}") from None
        except zx.ClientAuthenticationError as exc:
            raise UnavailableError(f"{where}: access denied ({_code(exc)}); check the credentials") from None
        except (zx.ServiceRequestError, zx.ServiceResponseError) as exc:
            raise UnavailableError(f"{where}: cannot reach {self.endpoint}: {first_line(exc)}") from None
        except zx.HttpResponseError as exc:
            if exc.status_code in (401, 403):
                raise UnavailableError(f"{where}: access denied ({_code(exc)}); check the credentials") from None
            raise UnavailableError(f"{where}: {_code(exc)}: {first_line(exc)}") from None
        except (zx.AzureError, ValueError) as exc:
            raise UnavailableError(f"{where}: {first_line(exc)}") from None

    def list(self) -> list[RemoteObject]:
        client, prefix = self.client(), self.key_prefix
        out = []
        with self._errors():
            for item in client.list_blobs(name_starts_with=prefix, include=["metadata"]):
                key = item.name[len(prefix):]
                if (item.metadata or {}).get("hdi_isfolder") == "true":  # a folder (hierarchical namespace)
                    key += "/"
                if key and key != "/":  # the prefix's own folder marker is not in it
                    out.append(RemoteObject(key, int(item.size or 0), (item.etag or "").strip('"'),
                                            cloud.mtime_ns(item.last_modified)))
        return out

    def download(self, key: str, into: BinaryIO) -> None:
        client = self.client()
        with self._errors(key):
            for chunk in client.download_blob(self.key_prefix + key).chunks():
                into.write(chunk)

    def any_object(self) -> bool:
        client = self.client()
        with self._errors():
            pages = client.list_blobs(name_starts_with=self.key_prefix, results_per_page=1).by_page()
            return any(True for _ in next(pages, ()))


def _code(exc: Any) -> str:
    """The service's error code (AuthorizationFailure, ...), else the HTTP status."""
    code = getattr(exc, "error_code", None)
    return str(getattr(code, "value", code) or getattr(exc, "status_code", None) or type(exc).__name__)


Store = AzureStore
