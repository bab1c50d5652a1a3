//! A blocking HTTP client for tests: every status is an answer (never an error), every call
//! bounded in time.

use std::time::Duration;

/// An agent that returns 4xx/5xx responses instead of errors and gives up after 10 s.
pub fn agent() -> ureq::Agent {
    agent_with_timeout(Duration::from_secs(10))
}

/// The same, giving up after `timeout` (for calls a test expects to be slow, such as one
/// waiting for Redis to time out).
pub fn agent_with_timeout(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(timeout))
        .build()
        .new_agent()
}

/// `GET url?query`: the status and the body; `Err` only when no answer came.
pub fn get(
    agent: &ureq::Agent,
    url: &str,
    query: &[(&str, &str)],
) -> Result<(u16, String), String> {
    let mut req = agent.get(url);
    for (k, v) in query {
        req = req.query(*k, *v);
    }
    let mut resp = req.call().map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let body = resp
        .body_mut()
        .read_to_string()
        .map_err(|e| e.to_string())?;
    Ok((status, body))
}
