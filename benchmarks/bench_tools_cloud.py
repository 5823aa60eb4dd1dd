"""The tools and remotes of the cloud sources: gsutil and ``gcloud storage`` (gs-to-meta only),
and rclone's gcs and azureblob remotes (gs-to-meta, az-to-meta; ``bench_tools.RcloneTool``).
Everything runs against the local servers: fake-gcs-server over https with a CA of the run,
Azurite with its published development account."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from bench_tools import AzLoc, Context, GcsLoc, Invocation, Loc, S3Loc, Tool, _first_line


def azurite_env(loc: AzLoc) -> dict[str, str]:
    """What points mcsync's ``az://`` at Azurite (its development account, no one's secret)."""
    from testbed.azurite import AzuriteEndpoint

    return AzuriteEndpoint(loc.url).env()


def rclone_remote(src: GcsLoc | AzLoc) -> tuple[dict[str, str], list[str]]:
    """rclone's remote ``G:`` (gcs) or ``Z:`` (azureblob) for ``src``: its variables and extra
    flags. GCS: anonymous, the JSON API's endpoint overridden, the server's CA (``--ca-cert``).
    Azure: Debian's rclone 1.60 takes an endpoint only as a suffix of ``https://ACCOUNT.``, or
    the emulator at its fixed port 10000; a container SAS URL names Azurite's own port."""
    if isinstance(src, GcsLoc):
        env = {"RCLONE_CONFIG_G_TYPE": "google cloud storage",
               "RCLONE_CONFIG_G_ANONYMOUS": "true",
               "RCLONE_CONFIG_G_ENDPOINT": f"{src.url}/storage/v1/"}
        return env, ["--ca-cert", str(src.ca)]
    from azure.storage.blob import ContainerSasPermissions, generate_container_sas

    from testbed.azurite import ACCOUNT, KEY

    sas = generate_container_sas(ACCOUNT, src.container, account_key=KEY,
                                 permission=ContainerSasPermissions(read=True, list=True),
                                 expiry=datetime.now(UTC) + timedelta(hours=12))
    return {"RCLONE_CONFIG_Z_TYPE": "azureblob",
            "RCLONE_CONFIG_Z_SAS_URL": f"{src.url}/{src.container}?{sas}"}, []


def _gs_to_s3(src: Loc, dst: Loc) -> str | None:
    """Why gsutil and gcloud storage are not run on src → dst: only gs-to-meta, over https."""
    if not (isinstance(src, GcsLoc) and isinstance(dst, S3Loc)):
        return "gs-to-meta only"
    if not src.url.startswith("https:") or not src.ca:
        return "needs GCS over https (fake-gcs-server)"
    return None


def _host_port(url: str) -> tuple[str, int]:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or (443 if parts.scheme == "https" else 80)


class GsutilTool(Tool):
    """``gsutil -m rsync -r gs://… s3://…``. gsutil reaches a GCS emulator only over https (its
    JSON API host and port in the boto config) and signs S3 with SigV2, which SeaweedFS takes.
    The Cloud SDK's ``gsutil`` wrapper passes CLOUDSDK_CORE_CUSTOM_CA_CERTS_FILE on as its CA,
    so CLOUDSDK_* is scrubbed and the CA goes in the boto config alone."""

    name = "gsutil"
    binary = "gsutil"
    install_hint = "pip install gsutil, or the Google Cloud SDK"
    CONFIG = """\
[Credentials]
gs_json_host = {gs_host}
gs_json_port = {gs_port}
gs_host = {gs_host}
gs_port = {gs_port}
aws_access_key_id = {access_key}
aws_secret_access_key = {secret_key}
s3_host = {s3_host}
s3_port = {s3_port}

[s3]
calling_format = boto.s3.connection.OrdinaryCallingFormat

[Boto]
is_secure = {s3_secure}
https_validate_certificates = True
ca_certificates_file = {ca}

[GSUtil]
prefer_api = json
default_project_id = mcsync
parallel_composite_upload_threshold = 0
"""

    def version(self) -> str:
        return _first_line([self.exe, "version"]) if self.exe else "not installed"

    def unsupported(self, src: Loc, dst: Loc) -> str | None:
        return _gs_to_s3(src, dst)

    def invocation(self, src: Loc, dst: Loc, ctx: Context) -> Invocation:
        assert isinstance(src, GcsLoc) and isinstance(dst, S3Loc)
        ep = ctx.servers[dst.server]
        gs_host, gs_port = _host_port(src.url)
        s3_host, s3_port = _host_port(ep.url)  # type: ignore[attr-defined]
        conf = ctx.confdir / "boto.cfg"
        conf.write_text(self.CONFIG.format(
            gs_host=gs_host, gs_port=gs_port, s3_host=s3_host, s3_port=s3_port,
            s3_secure=ep.url.startswith("https:"),  # type: ignore[attr-defined]
            access_key=ep.access_key, secret_key=ep.secret_key,  # type: ignore[attr-defined]
            ca=src.ca))
        gcloud_dir = ctx.confdir / "gcloud"  # no account of the user's: anonymous reads
        gcloud_dir.mkdir(exist_ok=True)
        env = {"BOTO_CONFIG": str(conf), "CLOUDSDK_CONFIG": str(gcloud_dir)}
        argv = [self.exe, "-m", "-q", "rsync", "-r", f"gs://{src.bucket}/{src.prefix}",
                f"s3://{dst.bucket}/{dst.prefix}"]
        return Invocation(argv, env)


class GcloudStorageTool(Tool):
    """``gcloud storage rsync -r gs://… s3://…``, anonymous (CLOUDSDK_AUTH_DISABLE_CREDENTIALS),
    the GCS endpoint and CA as CLOUDSDK_* properties, S3 through boto3 with AWS_* keys. Run
    without REQUESTS_CA_BUNDLE and CURL_CA_BUNDLE: gcloud's requests prefers either to
    core/custom_ca_certs_file."""

    name = "gcloud"
    binary = "gcloud"
    install_hint = "the Google Cloud SDK"

    def version(self) -> str:
        return _first_line([self.exe, "version"]) if self.exe else "not installed"

    def unsupported(self, src: Loc, dst: Loc) -> str | None:
        return _gs_to_s3(src, dst)

    def invocation(self, src: Loc, dst: Loc, ctx: Context) -> Invocation:
        assert isinstance(src, GcsLoc) and isinstance(dst, S3Loc) and src.ca
        ep = ctx.servers[dst.server]
        gcloud_dir = ctx.confdir / "gcloud"
        gcloud_dir.mkdir(exist_ok=True)
        env = {
            "CLOUDSDK_CONFIG": str(gcloud_dir),
            "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
            "CLOUDSDK_AUTH_DISABLE_CREDENTIALS": "true",
            "CLOUDSDK_CORE_CUSTOM_CA_CERTS_FILE": src.ca,
            "CLOUDSDK_API_ENDPOINT_OVERRIDES_STORAGE": f"{src.url}/storage/v1/",
            "CLOUDSDK_STORAGE_S3_ENDPOINT_URL": ep.url,  # type: ignore[attr-defined]
            "AWS_ACCESS_KEY_ID": ep.access_key,  # type: ignore[attr-defined]
            "AWS_SECRET_ACCESS_KEY": ep.secret_key,  # type: ignore[attr-defined]
            "AWS_DEFAULT_REGION": ep.region,  # type: ignore[attr-defined]
        }
        argv = ["env", "-u", "REQUESTS_CA_BUNDLE", "-u", "CURL_CA_BUNDLE", self.exe, "storage",
                "rsync", "-r",
                f"gs://{src.bucket}/{src.prefix}", f"s3://{dst.bucket}/{dst.prefix}"]
        return Invocation(argv, env)
