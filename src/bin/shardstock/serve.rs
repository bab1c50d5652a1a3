//! `shardstock serve`: [`shardstock::http`] with the binary's configuration, metrics recorder and
//! signals. The routes, bodies and status codes live in the library (`src/http.rs`).

use crate::Failure;
use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use clap::Args;
use metrics_exporter_prometheus::PrometheusHandle;
use shardstock::{BackgroundOptions, Engine, Store};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::OnceLock;
use std::time::Duration;

/// Arguments of `serve`.
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// Address to listen on (port 0: any free port; the bound address is printed on stdout
    /// as `listening on http://ADDR`). Overrides serve.listen (SHARDSTOCK_SERVE__LISTEN;
    /// default 127.0.0.1:8080).
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// How often the sweeper returns expired reservations, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    sweep_ms: u64,
    /// Largest request body in bytes (overrides serve.body_limit_bytes; larger answer 413).
    #[arg(long, value_name = "BYTES")]
    body_limit: Option<usize>,
    /// Engine calls not answered after this long answer 503 with the request id to retry with
    /// (overrides serve.request_timeout_ms; 0 = no limit).
    #[arg(long, value_name = "MS")]
    request_timeout_ms: Option<u64>,
    /// How long GET /readyz waits for the store before it counts a server unreachable
    /// (overrides serve.ready_timeout_ms; 1..=60000, default 1000).
    #[arg(long, value_name = "MS")]
    ready_timeout_ms: Option<u64>,
    /// How often the live audit checks conservation of the SKUs this process has used and
    /// exports `shardstock_audit_*`, in milliseconds (0: no live audit).
    #[arg(long, value_name = "MS", default_value_t = 10_000)]
    audit_every_ms: u64,
    #[command(flatten)]
    pub(crate) store: crate::StoreTuning,
    #[command(flatten)]
    pub(crate) metrics: crate::MetricsArgs,
    /// The `[serve]` settings with these flags applied (tokens come only from there: the
    /// configuration file or SHARDSTOCK_SERVE__ADMIN_TOKEN / SHARDSTOCK_SERVE__BUYER_TOKEN,
    /// never argv, which `ps` shows). Set by [`ServeArgs::apply`].
    #[arg(skip)]
    config: shardstock::config::ServeConfig,
}

impl ServeArgs {
    /// Writes the flags given over the `[serve]` settings, and keeps the result.
    pub(crate) fn apply(&mut self, serve: &mut shardstock::config::ServeConfig) {
        if let Some(addr) = self.listen {
            serve.listen = addr;
        }
        if let Some(b) = self.body_limit {
            serve.body_limit_bytes = b.max(1);
        }
        if let Some(ms) = self.request_timeout_ms {
            serve.request_timeout_ms = ms;
        }
        if let Some(ms) = self.ready_timeout_ms {
            serve.ready_timeout_ms = ms;
        }
        self.config = serve.clone();
    }
}

/// The recorder's handle, rendered by `GET /metrics`. Set by [`install_metrics`], which runs
/// before the store and engine are built; [`run_serve`] reads it.
static METRICS: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the metrics recorder for `serve` (before the engine is built): `/metrics` on the
/// API address always, and on `--metrics-addr` too when given.
pub(crate) async fn install_metrics(
    metrics_addr: Option<SocketAddr>,
    strategy: shardstock::Strategy,
) -> Result<(), Failure> {
    let handle = crate::exporter::install_handle(strategy)?;
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    if let Some(addr) = metrics_addr {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| Failure::new(format!("cannot serve metrics on {addr}: {e}")))?;
        let render = handle.clone();
        let app =
            Router::new().fallback(move || {
                let text = render.render();
                async move {
                    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
                }
            });
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::warn!(error = %e, "metrics listener stopped");
            }
        });
    }
    let _ = METRICS.set(handle);
    Ok(())
}

/// Runs the service until SIGTERM or ctrl-c; in-flight requests finish first.
pub(crate) async fn run_serve<S: Store>(
    engine: Engine<S>,
    a: ServeArgs,
) -> Result<ExitCode, Failure> {
    let listen = a.config.listen;
    // The background tasks are started here, with the engine's own call; not by `serve_with`.
    let mut options = a.config.api_options().sweep_every(None);
    // Before binding: no admin routes without a token beyond this machine.
    options
        .check_listen(listen)
        .map_err(|e| Failure::config(e.to_string()))?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| Failure::new(format!("cannot listen on {listen}: {e}")))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Failure::new(format!("cannot listen on {listen}: {e}")))?;
    if let Some(handle) = METRICS.get().cloned() {
        options = options.metrics(move || handle.render());
    }
    let every = |ms: u64| (ms > 0).then(|| Duration::from_millis(ms));
    let _background = engine.start_background(
        BackgroundOptions::default()
            .sweep_every(every(a.sweep_ms.max(1)))
            .audit_every(every(a.audit_every_ms)),
    );
    say!("listening on http://{addr}");
    tracing::info!(%addr, "serving");
    shardstock::http::serve_with(listener, engine, options, shutdown_signal())
        .await
        .map_err(|e| Failure::new(format!("server error: {e}")))?;
    eprintln!("shardstock serve: shut down");
    Ok(ExitCode::SUCCESS)
}

/// Completes on the first SIGTERM or ctrl-c (SIGINT).
pub(crate) async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
