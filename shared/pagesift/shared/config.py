"""Server configuration: one dataclass built from CLI flags and an optional TOML file.

Flags win over the file; the file wins over the defaults here. Every limit a
request can hit is named here so that error messages can quote it.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any


@dataclass
class ServerConfig:
    role: str = "primary"  # primary | standby; ignored with a witness (the lease decides)
    listen: str = "127.0.0.1:50051"
    advertise: str = ""  # where peers and clients reach this node (default: listen)
    data: Path = Path("./data")
    primary: str = ""  # the primary's address (standby only)
    primary_public: str = ""  # where clients reach the primary (default: what it announces)
    allow_private_networks: bool = False
    # jobs
    job_ttl_seconds: float = 24 * 3600.0
    max_batch_urls: int = 10_000
    max_crawl_limit: int = 100_000
    default_crawl_limit: int = 10_000
    default_concurrency: int = 8
    max_concurrency: int = 64
    default_page_size: int = 100
    max_page_size: int = 1_000
    max_url_length: int = 8_192
    max_regexes: int = 64  # per include_paths / exclude_paths list
    # A path filter is a few dozen characters; 1,000 leaves room for long alternations
    # while bounding the parse and the RE2 program (compile <~15 ms, see patterns.py).
    max_regex_length: int = 1_000
    # RE2 max_mem per pattern (program + DFA cache): 1 MiB fits any realistic path
    # filter; bounds a job's regex memory to 2 x max_regexes x this.
    max_regex_memory: int = 1 << 20
    # result paging by size (pagesift.shared.jobservice): a GetJob response (documents
    # plus status) is at most this many serialized bytes, whatever its limit; one
    # document larger than this still comes alone. 4 MiB: what a stock gRPC client
    # receives by default, well under the server's 64 MiB send limit.
    max_response_bytes: int = 4 * 1024 * 1024
    # WatchJob streams (see pagesift.shared.streams)
    max_concurrent_streams: int = 64  # per account (its accounts-file value wins); 0 = none
    max_total_streams: int = 1_024  # every account together on this node; 0 = none
    # engine
    user_agent: str = "pagesift/0.1 (+https://example.invalid/pagesift)"
    per_host_concurrency: int = 8
    per_host_delay: float = 0.0
    connect_timeout: float = 10.0
    read_timeout: float = 30.0
    max_body_bytes: int = 10 * 1024 * 1024
    max_redirects: int = 10
    respect_robots: bool = True
    extract_processes: int = -1  # HTML extraction workers: -1 = one per CPU, 0 = inline
    # documents (pagesift.primary.documents): the most pages a job's max_pages may ask
    # for (and its default), and how long one conversion may run in a worker
    max_document_pages: int = 1_000
    document_timeout: float = 60.0
    # freshness (pagesift.primary.pagecache): how long a cached page and a change-
    # tracking record live; a request's max_age may not exceed page_cache_ttl
    page_cache_ttl: float = 7 * 24 * 3600.0
    change_tracking_ttl: float = 90 * 24 * 3600.0
    # retries of transient page failures (pagesift.primary.retrypolicy)
    max_retries: int = 3  # per page, when the job does not ask (0 = no retry)
    max_retries_limit: int = 10  # the most a job may ask for
    retry_base_delay: float = 0.5  # full-jitter window of the first retry, doubled per retry
    retry_max_delay: float = 30.0  # the window's cap
    max_retry_after: float = 120.0  # a longer Retry-After fails the page (retry_after_too_long)
    adaptive_throttle: bool = True  # per-host delay that follows 429/503 and latency
    throttle_max_delay: float = 10.0  # the adaptive delay's cap
    # request control per job (pagesift.primary.reqprofile)
    max_request_timeout: float = 120.0  # the longest options.timeout a job may ask for
    # the proxy pool: name -> http(s)://[user:password@]host:port ([server.proxies] table)
    proxies: dict[str, str] = field(default_factory=dict)
    proxy_rotation: str = "per_host"  # per_host (sticky) | per_request, for proxy "pool"
    default_proxy: str = ""  # a job's proxy when it names none: "" direct | "pool" | a name
    # store
    fsync: bool = False
    # replication
    replication_mode: str = "async"  # async | sync
    sync_timeout: float = 2.0
    backlog_bytes: int = 512 * 1024 * 1024  # ~74 s at the measured peak crawl rate (~7 MB/s)
    auto_promote_after: float = 0.0  # without a witness: refused unless unsafe_auto_promote
    unsafe_auto_promote: bool = False  # allow auto_promote_after with no witness (split brain)
    # the witness (pagesift.node.witness): etcd://HOST:PORT[,HOST:PORT...]; "" = none
    witness: str = ""
    witness_ttl: float = 5.0  # seconds a primary's lease lives without a keepalive
    pair: str = "pagesift"  # the pair's key prefix in the witness (several pairs, one etcd)
    witness_user: str = ""  # an etcd user (etcd auth enabled); "" = no authentication
    witness_password_file: str = ""  # that user's password, alone in a file (mode 600)
    # health: a standby is ``pagesift.replica`` SERVING within this many seconds of its primary
    replica_max_lag: float = 10.0
    # accounts, webhooks, metrics, transport security
    accounts_file: str = ""  # "" = one anonymous account
    webhook_max_attempts: int = 8
    webhook_base_delay: float = 0.5
    webhook_max_delay: float = 30.0
    webhook_timeout: float = 10.0
    # a page event's document (include_document): the most bytes of its JSON embedded;
    # a larger one is left out ("document_omitted": "too_large"). Fixed per job when
    # the job starts, so every delivery of an event sends the same body.
    webhook_max_document_bytes: int = 256 * 1024
    metrics_listen: str = ""  # e.g. 127.0.0.1:9464; "" = off
    tls_cert: str = ""  # public port TLS
    tls_key: str = ""
    replication_listen: str = ""  # a separate mTLS port for the replication stream
    replication_ca: str = ""  # primary: CA of standby client certs; standby: CA of the primary
    replication_cert: str = ""  # standby: its client certificate (mTLS)
    replication_key: str = ""
    replication_token_file: str = ""  # shared token (both nodes) when not using mTLS
    # logging
    log_format: str = "text"  # text | json
    # Map (pagesift.primary.mapper): a site's URLs from its sitemaps and a shallow
    # link walk, nothing stored
    max_map_urls: int = 100_000  # the most URLs one Map call may return
    default_map_limit: int = 5_000  # a Map call's limit when it asks for 0
    map_max_depth: int = 2  # link depth the walk lists URLs to (pages below it are fetched)
    map_max_pages: int = 500  # pages one Map call fetches at most (its link walk)
    map_concurrency: int = 16  # pages one Map call fetches at once (per-host slots still apply)
    map_timeout: float = 60.0  # seconds of link walk at most; the URLs found so far are returned

    @classmethod
    def load(cls, file: Path | None, overrides: dict[str, Any]) -> ServerConfig:
        """Defaults, then the TOML file's ``[server]`` table, then non-None overrides."""
        values: dict[str, Any] = {}
        if file is not None:
            with file.open("rb") as fh:
                values.update(tomllib.load(fh).get("server", {}))
        values.update({k: v for k, v in overrides.items() if v is not None})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown config keys: {', '.join(unknown)}")
        cfg = cls(**values)
        cfg.data = Path(cfg.data)
        return cfg
