"""Server configuration: one dataclass, every key documented where it is declared.

Sources, each over the one before: the defaults here, the TOML file's ``[server]``
table (``--config FILE``), ``PAGESIFT_<KEY>`` environment variables, then the
``serve`` flags. ``pagesift.core.config.settings.load_config`` fills this class and
checks every value strictly, raising ``ConfigError``: one line naming the key, its source
and what was expected. This module imports no loader (the loader imports it): pydantic is
for ``serve``, not for every client command that names a config type.
Every limit a request can hit is named here so that error messages can quote it.

Each field is ``Annotated[type, Doc(meaning, limits)] = default``: ``Doc`` is the
one-line meaning README's generated config table shows, and its optional ``ge``
bound is checked at load time (only where a smaller value would fail later).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated


class ConfigError(ValueError):
    """A config value the node cannot run with: one line, ``KEY (SOURCE): expected ...``."""


@dataclass(frozen=True)
class Doc:
    """A config key's one-line meaning, and a lower bound checked at load time."""

    text: str
    ge: float | None = None


@dataclass
class ServerConfig:
    role: Annotated[str, Doc("primary or standby; ignored with a witness (the lease decides)")] = (
        "primary"
    )
    listen: Annotated[str, Doc("HOST:PORT of the public gRPC port")] = "127.0.0.1:50051"
    advertise: Annotated[str, Doc('where peers and clients reach this node; "" = listen')] = ""
    data: Annotated[Path, Doc("the store's directory")] = Path("./data")
    primary: Annotated[str, Doc("the primary's HOST:PORT (standby only)")] = ""
    primary_public: Annotated[
        str, Doc('where clients reach the primary; "" = what the primary announces')
    ] = ""
    allow_private_networks: Annotated[
        bool, Doc("let jobs fetch loopback, private and link-local addresses")
    ] = False
    # jobs
    job_ttl_seconds: Annotated[float, Doc("seconds a finished job stays queryable", ge=0)] = (
        24 * 3600.0
    )
    max_batch_urls: Annotated[int, Doc("the most URLs one batch job may take", ge=0)] = 10_000
    max_crawl_limit: Annotated[int, Doc("the most pages a crawl's limit may ask for", ge=0)] = (
        100_000
    )
    default_crawl_limit: Annotated[int, Doc("a crawl's limit when it asks for 0", ge=0)] = 10_000
    default_concurrency: Annotated[int, Doc("pages at once per job when it asks for 0", ge=0)] = 8
    max_concurrency: Annotated[int, Doc("the most pages at once a job may ask for", ge=0)] = 64
    default_page_size: Annotated[int, Doc("documents per GetJob when it asks for 0", ge=0)] = 100
    max_page_size: Annotated[int, Doc("the most documents one GetJob may ask for", ge=0)] = 1_000
    max_url_length: Annotated[int, Doc("the longest URL accepted, in characters", ge=0)] = 8_192
    max_regexes: Annotated[int, Doc("regexes per include_paths / exclude_paths list", ge=0)] = 64
    # A path filter is a few dozen characters; 1,000 leaves room for long alternations
    # while bounding the parse and the RE2 program (compile <~15 ms, see patterns.py).
    max_regex_length: Annotated[int, Doc("the longest path regex, in characters", ge=0)] = 1_000
    # RE2 max_mem per pattern (program + DFA cache): 1 MiB fits any realistic path
    # filter; bounds a job's regex memory to 2 x max_regexes x this.
    max_regex_memory: Annotated[
        int, Doc("bytes of RE2 memory per pattern (program + DFA cache)", ge=1)
    ] = 1 << 20
    # result paging by size (pagesift.core.api.paging): a GetJob response (documents
    # plus status) is at most this many serialized bytes, whatever its limit; one
    # document larger than this still comes alone. 4 MiB: what a stock gRPC client
    # receives by default, well under the server's 64 MiB send limit.
    max_response_bytes: Annotated[
        int, Doc("bytes of one GetJob response (a bigger document comes alone)", ge=1)
    ] = 4 * 1024 * 1024
    # WatchJob streams (see pagesift.core.api.streams)
    max_concurrent_streams: Annotated[
        int, Doc("WatchJob streams per account (its accounts-file value wins); 0 = none", ge=0)
    ] = 64
    max_total_streams: Annotated[int, Doc("WatchJob streams on this node; 0 = none", ge=0)] = 1_024
    # WatchJob memory (pagesift.core.api.streams): documents read ahead and not yet taken
    # by the transport, per stream and on the whole node (each byte costs ~3 in memory)
    watch_stream_bytes: Annotated[
        int, Doc("bytes one WatchJob stream reads ahead at most (a bigger document alone)", ge=1)
    ] = 4 * 1024 * 1024
    watch_total_bytes: Annotated[
        int, Doc("bytes every WatchJob stream together holds; past it they wait; 0 = none", ge=0)
    ] = 256 * 1024 * 1024
    watch_account_bytes: Annotated[
        int, Doc("bytes one account's WatchJob streams together hold; 0 = none", ge=0)
    ] = 64 * 1024 * 1024
    # engine
    user_agent: Annotated[str, Doc("the User-Agent of every request (and robots.txt's)")] = (
        "pagesift/0.1 (+https://example.invalid/pagesift)"
    )
    per_host_concurrency: Annotated[
        int, Doc("requests at once to one host, across all jobs", ge=1)
    ] = 8
    per_host_delay: Annotated[float, Doc("seconds between requests to one host", ge=0)] = 0.0
    connect_timeout: Annotated[float, Doc("seconds to connect to a host", ge=0)] = 10.0
    read_timeout: Annotated[float, Doc("seconds to read a response", ge=0)] = 30.0
    max_body_bytes: Annotated[int, Doc("bytes of a response body at most (too_large)", ge=0)] = (
        10 * 1024 * 1024
    )
    max_redirects: Annotated[int, Doc("redirects followed per page at most", ge=0)] = 10
    respect_robots: Annotated[bool, Doc("obey robots.txt and its Crawl-delay")] = True
    extract_processes: Annotated[
        int, Doc("extraction worker processes: -1 = one per CPU, 0 = none (in a thread)")
    ] = -1
    # documents (pagesift.primary.extract.documents): the most pages a job's max_pages may ask
    # for (and its default), and how long one conversion may run in a worker
    max_document_pages: Annotated[
        int, Doc("the most pages of a document max_pages may ask for (and its default)", ge=0)
    ] = 1_000
    document_timeout: Annotated[
        float, Doc("seconds one document conversion may take in a worker", ge=0)
    ] = 60.0
    # extraction workers (pagesift.primary.engine.workers): HTML extraction's deadline, each
    # worker's address-space cap, and the peak memory after which a worker is replaced.
    # A legitimate 10 MiB page (max_body_bytes) of table cells peaks at 1.1 GiB of
    # address space (0.9 GiB resident) in lexbor + Markdown: the cap leaves room for it
    extract_timeout: Annotated[
        float, Doc("seconds one HTML page's extraction may take in a worker", ge=0)
    ] = 30.0
    worker_memory_limit: Annotated[
        int, Doc("bytes of address space per extraction worker (RLIMIT_AS); 0 = none", ge=0)
    ] = 2 << 30
    worker_recycle_rss: Annotated[
        int, Doc("a worker whose peak memory in one page passed this many bytes is replaced", ge=0)
    ] = 384 << 20
    # rendering (pagesift.primary.engine.browser): the headless browser, how many pages
    # render at once, when a browser is replaced, and the bounds of waits, actions and
    # screenshots. Debian's chromium-headless-shell (apt) is the default browser; "" turns
    # rendering off (FETCH_ENGINE_UNSPECIFIED then means HTTP).
    browser_executable: Annotated[
        str, Doc('the headless browser to render with; "" = no rendering')
    ] = "/usr/lib/chromium/chromium-headless-shell"
    max_browser_pages: Annotated[
        int,
        Doc("pages rendered at once; 0 = from CPUs and memory (2 per CPU, 1 per 256 MiB)", ge=0),
    ] = 0
    browser_recycle_pages: Annotated[
        int, Doc("a browser is replaced after rendering this many pages; 0 = never", ge=0)
    ] = 500
    browser_memory_limit: Annotated[
        int,
        Doc("a browser whose processes pass this many bytes (PSS) is replaced; 0 = never", ge=0),
    ] = 2 << 30
    browser_page_memory_limit: Annotated[
        int,
        Doc(
            "bytes (RSS) a page's renderer may use: past it the renderer is killed at once "
            "and only its page fails too_large; 0 = no cap",
            ge=0,
        ),
    ] = 1 << 30
    render_timeout: Annotated[
        float, Doc("seconds one page's render may take (navigation, waits, actions)", ge=0.001)
    ] = 30.0
    max_render_wait: Annotated[
        float, Doc("seconds a wait_for or wait action may ask for at most", ge=0.001)
    ] = 10.0
    max_actions_time: Annotated[
        float, Doc("seconds a page's actions may take together", ge=0.001)
    ] = 30.0
    max_screenshot_bytes: Annotated[int, Doc("bytes of a screenshot at most (too_large)", ge=1)] = (
        8 << 20
    )
    max_screenshot_height: Annotated[
        int, Doc("CSS pixels a full-page screenshot is cut at", ge=100)
    ] = 16_384
    # freshness (pagesift.primary.jobs.pagecache): how long a cached page and a change-
    # tracking record live; a request's max_age may not exceed page_cache_ttl
    page_cache_ttl: Annotated[
        float, Doc("seconds a cached page lives (and the largest max_age)", ge=0)
    ] = 7 * 24 * 3600.0
    change_tracking_ttl: Annotated[float, Doc("seconds a change-tracking record lives", ge=0)] = (
        90 * 24 * 3600.0
    )
    # retries of transient page failures (pagesift.primary.engine.retrypolicy)
    max_retries: Annotated[
        int, Doc("retries per page when the job does not ask (0 = no retry)", ge=0)
    ] = 3
    max_retries_limit: Annotated[int, Doc("the most retries a job may ask for", ge=0)] = 10
    retry_base_delay: Annotated[
        float, Doc("seconds: full-jitter window of the first retry, doubled per retry", ge=0)
    ] = 0.5
    retry_max_delay: Annotated[float, Doc("seconds: the retry window's cap", ge=0)] = 30.0
    # quarantine of poison jobs (pagesift.core.jobs.quarantine)
    poison_threshold: Annotated[
        int, Doc("interruptions (crash, freeze) without progress that pause a job", ge=1)
    ] = 2
    poison_worker_losses: Annotated[
        int, Doc("extraction workers lost without progress that pause a job", ge=1)
    ] = 3
    poison_progress_pages: Annotated[
        int, Doc("pages done (at least 2 x the job's concurrency) that reset the counts", ge=1)
    ] = 20
    poison_probation_seconds: Annotated[
        float, Doc("seconds an interrupted job runs alone before others may join it", ge=0)
    ] = 60.0
    max_retry_after: Annotated[
        float, Doc("seconds: a longer Retry-After fails the page (retry_after_too_long)", ge=0)
    ] = 120.0
    adaptive_throttle: Annotated[bool, Doc("per-host delay that follows 429/503 and latency")] = (
        True
    )
    throttle_max_delay: Annotated[float, Doc("seconds: the adaptive delay's cap", ge=0)] = 10.0
    # request control per job (pagesift.primary.engine.reqprofile)
    max_request_timeout: Annotated[
        float, Doc("seconds: the longest options.timeout a job may ask for", ge=0)
    ] = 120.0
    # the proxy pool: name -> http(s)://[user:password@]host:port ([server.proxies] table)
    proxies: Annotated[
        dict[str, str], Doc("the proxy pool: name = http(s)://[user:password@]host:port")
    ] = field(default_factory=dict)
    proxy_rotation: Annotated[
        str, Doc('per_host (sticky) or per_request, for a job\'s proxy "pool"')
    ] = "per_host"
    default_proxy: Annotated[
        str, Doc('a job\'s proxy when it names none: "" direct, "pool" or a name')
    ] = ""
    # store
    fsync: Annotated[bool, Doc("every write group waits for fsync (power-loss safe)")] = False
    # room kept for the node itself on the data volume (pagesift.core.api.storagewatch)
    storage_reserve_bytes: Annotated[
        int, Doc("bytes of the reserve file released when the data volume fills; 0 = none", ge=0)
    ] = 64 << 20
    # replication
    replication_mode: Annotated[
        str, Doc("async or sync (pages visible once the standby has them)")
    ] = "async"
    sync_timeout: Annotated[
        float, Doc("seconds without an ack before sync mode degrades to async", ge=0)
    ] = 2.0
    # ~74 s at the measured peak crawl rate (~7 MB/s)
    backlog_bytes: Annotated[
        int, Doc("bytes of replication log kept for a standby that reconnects", ge=0)
    ] = 512 * 1024 * 1024
    auto_promote_after: Annotated[
        float, Doc("standby: promote after the primary is silent this long; 0 = never", ge=0)
    ] = 0.0
    unsafe_auto_promote: Annotated[
        bool, Doc("allow auto_promote_after with no witness (split brain)")
    ] = False
    # the witness (pagesift.coord.witness)
    witness: Annotated[
        str, Doc('etcd://HOST:PORT[,HOST:PORT...] electing the primary; "" = none')
    ] = ""
    witness_ttl: Annotated[
        float, Doc("seconds a primary's lease lives without a keepalive", ge=0)
    ] = 5.0
    pair: Annotated[str, Doc("the pair's key prefix in the witness (several pairs, one etcd)")] = (
        "pagesift"
    )
    cluster: Annotated[
        str, Doc('the cluster this pair joins in the witness\'s etcd; "" = a pair alone')
    ] = ""
    witness_failsafe: Annotated[
        bool, Doc("write past a lapsed lease while every standby vouches for this primary")
    ] = True
    witness_user: Annotated[str, Doc('an etcd user (etcd auth); "" = no authentication')] = ""
    witness_password_file: Annotated[
        str, Doc("that user's password, alone in a file (mode 600)")
    ] = ""
    cluster_members: Annotated[
        str, Doc('the cluster\'s members TOML (pairs, keys, node addresses); "" = unverified')
    ] = ""
    cluster_signing_key_file: Annotated[
        str, Doc("this pair's Ed25519 private key (PEM) its registry records are signed with")
    ] = ""
    # pagesift.core.cluster.tenure: the old owner's registry read (1 s) and its bounded
    # call, then its abandon of the requests in flight
    cluster_handover: Annotated[
        float, Doc("seconds a host that came to this pair waits before its first request", ge=0)
    ] = 3.0
    # health: a standby is ``pagesift.replica`` SERVING within this many seconds of its primary
    replica_max_lag: Annotated[
        float, Doc("seconds of lag within which a standby is pagesift.replica SERVING", ge=0)
    ] = 10.0
    # accounts, webhooks, metrics, transport security
    accounts_file: Annotated[str, Doc('the accounts TOML; "" = one anonymous account')] = ""
    webhook_max_attempts: Annotated[int, Doc("delivery attempts per webhook event", ge=0)] = 8
    webhook_base_delay: Annotated[
        float, Doc("seconds before the first webhook retry (doubled per retry)", ge=0)
    ] = 0.5
    webhook_max_delay: Annotated[float, Doc("seconds: the webhook retry delay's cap", ge=0)] = 30.0
    webhook_timeout: Annotated[float, Doc("seconds one webhook delivery may take", ge=0)] = 10.0
    # a page event's document (include_document): the most bytes of its JSON embedded;
    # a larger one is left out ("document_omitted": "too_large"). Fixed per job when
    # the job starts, so every delivery of an event sends the same body.
    webhook_max_document_bytes: Annotated[
        int, Doc("bytes of a page event's embedded document JSON at most", ge=0)
    ] = 256 * 1024
    metrics_listen: Annotated[str, Doc('HOST:PORT of plain-HTTP /metrics; "" = off')] = ""
    http_listen: Annotated[
        str, Doc('HOST:PORT of the Firecrawl HTTP gateway run in this node; "" = off')
    ] = ""
    http_trust_forwarded: Annotated[
        bool, Doc("that gateway reads a proxy's Forwarded headers for its absolute URLs")
    ] = False
    # connection discipline of the node's HTTP listeners (pagesift.core.util.listeners):
    # the gateway's caps are clipped to what RLIMIT_NOFILE leaves past the descriptor
    # reserve (pagesift.node.fdreserve); /metrics has a small cap of its own
    http_header_timeout: Annotated[
        float,
        Doc("seconds a request line and headers may take (from connect or first byte)", ge=0.001),
    ] = 10.0
    http_idle_timeout: Annotated[
        float, Doc("seconds an idle keep-alive HTTP connection is kept open", ge=0.001)
    ] = 30.0
    http_body_timeout: Annotated[
        float, Doc("seconds a request body may take to arrive (408 past it)", ge=0.001)
    ] = 60.0
    http_max_requests_per_connection: Annotated[
        int, Doc("requests on one HTTP connection before it is closed; 0 = no limit", ge=0)
    ] = 1_000
    http_max_connections: Annotated[
        int, Doc("open connections of the HTTP gateway (clipped to the descriptor budget)", ge=1)
    ] = 4_096
    http_max_connections_per_client: Annotated[
        int, Doc("open gateway connections per client address (IPv6: per /64); 0 = no cap", ge=0)
    ] = 256
    tls_cert: Annotated[str, Doc("PEM certificate for TLS on the public port")] = ""
    tls_key: Annotated[str, Doc("PEM private key for TLS on the public port")] = ""
    replication_listen: Annotated[
        str, Doc("HOST:PORT of a separate mTLS port for the replication stream")
    ] = ""
    replication_ca: Annotated[
        str, Doc("PEM CA: primary, of standby client certs; standby, of the primary")
    ] = ""
    replication_cert: Annotated[str, Doc("standby: its client certificate (mTLS)")] = ""
    replication_key: Annotated[str, Doc("standby: its client private key (mTLS)")] = ""
    replication_token_file: Annotated[
        str, Doc("shared replication token (both nodes) when not using mTLS")
    ] = ""
    # logging
    log_format: Annotated[str, Doc("text or json (one JSON object a line)")] = "text"
    # the event-loop lag monitor (pagesift.node.looplag)
    loop_lag_interval: Annotated[
        float, Doc("seconds between the event-loop lag monitor's wake-ups", ge=0.01)
    ] = 0.25
    loop_lag_warn_seconds: Annotated[
        float, Doc("event-loop lag past which a WARNING is logged (rate-limited)", ge=0)
    ] = 0.5
    # Map (pagesift.primary.jobs.mapper): a site's URLs from its sitemaps and a shallow
    # link walk, nothing stored
    max_map_urls: Annotated[int, Doc("the most URLs one Map call may return", ge=0)] = 100_000
    default_map_limit: Annotated[int, Doc("a Map call's limit when it asks for 0", ge=0)] = 5_000
    map_max_depth: Annotated[
        int, Doc("link depth a Map walk lists URLs to (pages below it are fetched)", ge=0)
    ] = 2
    map_max_pages: Annotated[int, Doc("pages one Map call fetches at most", ge=0)] = 500
    map_concurrency: Annotated[
        int, Doc("pages one Map call fetches at once (per-host slots still apply)", ge=0)
    ] = 16
    map_timeout: Annotated[
        float,
        Doc("seconds one Map call takes at most, sitemaps included; it returns what it has", ge=0),
    ] = 60.0
    # the model formats (pagesift.primary.models): an OpenAI-compatible chat-completions
    # endpoint the operator runs (vLLM, Ollama, llama.cpp's server, LM Studio, OpenAI)
    model_url: Annotated[
        str, Doc('the model endpoint\'s base URL (http://HOST:PORT/v1); "" = no model formats')
    ] = ""
    model_name: Annotated[str, Doc("the model its requests name")] = ""
    model_key_file: Annotated[
        str, Doc('the endpoint\'s API key, alone in a file (sent as Bearer); "" = none')
    ] = ""
    model_timeout: Annotated[float, Doc("seconds one model call may take", ge=0.001)] = 60.0
    model_max_tokens: Annotated[int, Doc("output tokens one model call may ask for", ge=1)] = 1_024
    model_input_tokens: Annotated[
        int, Doc("tokens of a page's markdown sent to the model (3 characters a token)", ge=1)
    ] = 3_000
    model_concurrency: Annotated[
        int, Doc("model calls at once on this node (shared fairly between accounts)", ge=1)
    ] = 4
    model_retries: Annotated[
        int, Doc("further calls when an answer is not valid under the schema", ge=0)
    ] = 2
    model_response_format: Annotated[
        str, Doc("how the schema is sent: json_schema (OpenAI's) or json_object (with schema)")
    ] = "json_schema"
    model_bypass_address_guard: Annotated[
        bool, Doc("let the model endpoint be on a loopback or private address (the operator's)")
    ] = False
    # discovery bounds (pagesift.primary.engine.sitemaps, frontier.seed)
    sitemap_file_timeout: Annotated[
        float, Doc("seconds one sitemap file may take to arrive (each attempt)", ge=0)
    ] = 30.0
    crawl_seed_timeout: Annotated[
        float,
        Doc("seconds a crawl reads sitemaps at most (its pages are fetched meanwhile)", ge=0),
    ] = 60.0
