//! `shardstock serve`: [`shardstock::http`] with the binary's configuration, metrics recorder and
//! signals. The routes, bodies and status codes live in the library (`src/http.rs`).

use crate::Failure;
use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use clap::Args;
use metrics_exporter_prometheus::PrometheusHandle;
use shardstock::{Engine, Store};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::OnceLock;
use std::time::Duration;

/// Arguments of `serve`.
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// Address to listen on (port 0: any free port; the bound address is printed on stdout
    /// as `listening on http://ADDR`).
    #[arg(
        long,
        value_name = "ADDR",
        default_value = "127.0.0.1:8080",
        env = "SHARDSTOCK_LISTEN"
    )]
    listen: SocketAddr,
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
    /// The `[serve]` settings (tokens come only from there: the configuration file or
    /// SHARDSTOCK_SERVE__ADMIN_TOKEN / SHARDSTOCK_SERVE__BUYER_TOKEN, never argv, which `ps`
    /// shows). Set by `main` from the loaded configuration.
    #[arg(skip)]
    pub(crate) config: shardstock::config::ServeConfig,
    /// How often the live audit checks conservation of the SKUs this process has used and
    /// exports `shardstock_audit_*`, in milliseconds (0: no live audit).
    #[arg(long, value_name = "MS", default_value_t = 10_000)]
    audit_every_ms: u64,
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
    let mut config = a.config.clone();
    if let Some(b) = a.body_limit {
        config.body_limit_bytes = b.max(1);
    }
    if let Some(ms) = a.request_timeout_ms {
        config.request_timeout_ms = ms;
    }
    let mut options = config
        .api_options()
        .sweep_every(Some(Duration::from_millis(a.sweep_ms.max(1))));
    // Before binding: no admin routes without a token beyond this machine.
    options
        .check_listen(a.listen)
        .map_err(|e| Failure::new(e.to_string()))?;
    let listener = tokio::net::TcpListener::bind(a.listen)
        .await
        .map_err(|e| Failure::new(format!("cannot listen on {}: {e}", a.listen)))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Failure::new(format!("cannot listen on {}: {e}", a.listen)))?;
    if let Some(handle) = METRICS.get().cloned() {
        options = options.metrics(move || handle.render());
    }
    let _audit = (a.audit_every_ms > 0)
        .then(|| engine.start_live_audit(Duration::from_millis(a.audit_every_ms), Vec::new()));
    println!("listening on http://{addr}");
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
