//! `meridian_hook._native`: the Rust half of Meridian's in-engine vLLM hook. It carries
//! out `meridian-core`'s policy inside vLLM — the order of the running batch and the
//! preemption victim ([`sched`]), forced ends of thinking by budget, proxy directive or
//! entropy signal ([`exits`]) — and serves the proxy's policy channel ([`channel`]). The
//! Python package around it (`vllm-hook/python/meridian_hook`) plugs these into vLLM's
//! scheduler class, logits-processor and general-plugin extension points.

pub mod channel;
mod error;
pub mod exits;
pub mod metrics;
pub mod sched;
mod signals;

use std::sync::{Arc, Mutex, OnceLock};

use meridian_core::channel::Directive;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

pub use error::HookError;

/// This process's hook state, shared by every object the Python side creates.
pub fn shared() -> Arc<channel::Shared> {
    static SHARED: OnceLock<Arc<channel::Shared>> = OnceLock::new();
    Arc::clone(SHARED.get_or_init(Default::default))
}

static ROLE: Mutex<Option<channel::Role>> = Mutex::new(None);

fn secret_from_env(token_env: &str) -> Result<String, HookError> {
    match std::env::var(token_env) {
        Ok(s) if !s.trim().is_empty() => Ok(s.trim().to_owned()),
        _ => Err(HookError::MissingSecret(token_env.to_owned())),
    }
}

/// Opens the policy channel listener in this process (idempotent); returns the bound
/// address.
#[pyfunction]
#[pyo3(signature = (listen, token_env, policy, entropy, can_end_thinking))]
fn start_listener(
    listen: &str,
    token_env: &str,
    policy: &str,
    entropy: bool,
    can_end_thinking: bool,
) -> PyResult<String> {
    let mut role = ROLE.lock().map_err(|_| PyValueError::new_err("hook state poisoned"))?;
    match role.as_ref() {
        Some(channel::Role::Listener(s)) => return Ok(s.addr.to_string()),
        Some(channel::Role::Follower(_)) => *role = None,
        None => {}
    }
    let secret = secret_from_env(token_env)?;
    let hello = channel::hello(policy, entropy, can_end_thinking);
    let server = channel::ChannelServer::start(listen, secret, hello, shared())?;
    let addr = server.addr.to_string();
    *role = Some(channel::Role::Listener(server));
    Ok(addr)
}

/// Follows the listener of another process (the engine core) from this one; a no-op
/// where this process already listens. Returns whether a follower runs.
#[pyfunction]
fn start_follower(listen: &str, token_env: &str, worker: String) -> PyResult<bool> {
    let mut role = ROLE.lock().map_err(|_| PyValueError::new_err("hook state poisoned"))?;
    match role.as_ref() {
        Some(channel::Role::Listener(_)) => return Ok(false),
        Some(channel::Role::Follower(_)) => return Ok(true),
        None => {}
    }
    let secret = secret_from_env(token_env)?;
    let follower = channel::Follower::start(channel::connect_address(listen), secret, worker, shared())
        .map_err(|e| HookError::Listen { addr: listen.to_owned(), reason: e.to_string() })?;
    *role = Some(channel::Role::Follower(follower));
    Ok(true)
}

/// Records whether this engine can end thinking on request (see `Shared`).
#[pyfunction]
fn set_can_end_thinking(can: bool) {
    shared().can_end_thinking.store(can, std::sync::atomic::Ordering::Relaxed);
}

/// Marks the hook disabled in this process (a vLLM it does not support, with
/// `hook.on_unsupported_vllm = "disable"`): its metrics and its hello say so.
#[pyfunction]
fn set_disabled(disabled: bool) {
    let s = shared();
    s.disabled.store(disabled, std::sync::atomic::Ordering::Relaxed);
    s.counters.set_disabled(disabled);
}

/// `"listener"`, `"follower"` or `None`.
#[pyfunction]
fn channel_role() -> Option<&'static str> {
    match ROLE.lock().ok()?.as_ref()? {
        channel::Role::Listener(_) => Some("listener"),
        channel::Role::Follower(_) => Some("follower"),
    }
}

/// Closes this process's channel role (tests, and the plugin's shutdown).
#[pyfunction]
fn stop_channel() {
    if let Ok(mut role) = ROLE.lock() {
        *role = None;
    }
}

/// Applies a directive given as channel JSON, as if it came over the channel.
#[pyfunction]
fn apply_directive(json: &str) -> PyResult<u64> {
    let d: Directive =
        serde_json::from_str(json).map_err(|e| PyValueError::new_err(format!("bad directive: {e}")))?;
    let s = shared();
    let seq = s.directives.lock().map_err(|_| PyValueError::new_err("hook state poisoned"))?.apply(d);
    s.counters.add(metrics::Counter::Directives, 1);
    Ok(seq)
}

/// Counts an error the Python side caught at `site` (`scheduler`, `logits_processor`,
/// `channel`, `sync`) before falling back to stock behaviour.
#[pyfunction]
fn count_error(site: &str) -> PyResult<()> {
    let c = match site {
        "scheduler" => metrics::Counter::ErrorSchedule,
        "logits_processor" => metrics::Counter::ErrorLogits,
        "channel" => metrics::Counter::ErrorChannel,
        "sync" => metrics::Counter::ErrorSync,
        other => return Err(PyValueError::new_err(format!("unknown error site {other:?}"))),
    };
    shared().counters.add(c, 1);
    Ok(())
}

/// This process's metrics (plus those its followers reported), Prometheus text.
#[pyfunction]
fn render_metrics() -> String {
    shared().counters.render()
}

/// The phase (`"pending"`, `"think"`, `"output"`) of a request that generated `output`
/// after `prompt`, by the phase rule the proxy and the hook follow
/// (`meridian_core::phase`); `"pending"` without an end delimiter (phases unknown). The
/// step tracer asks it of each request vLLM preempts: rarely, so copying the ids is fine.
#[pyfunction]
fn phase_after(start: Vec<u32>, end: Vec<u32>, prompt: Vec<u32>, output: Vec<u32>) -> &'static str {
    meridian_core::phase::ThinkMarkers::new(start, end)
        .map_or(meridian_core::Phase::Pending, |m| meridian_core::phase::phase_after(&m, &prompt, &output))
        .as_str()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("PROTOCOL_VERSION", meridian_core::channel::PROTOCOL_VERSION)?;
    m.add_class::<sched::SchedulerCore>()?;
    m.add_class::<exits::ExitController>()?;
    m.add_function(wrap_pyfunction!(start_listener, m)?)?;
    m.add_function(wrap_pyfunction!(start_follower, m)?)?;
    m.add_function(wrap_pyfunction!(channel_role, m)?)?;
    m.add_function(wrap_pyfunction!(set_can_end_thinking, m)?)?;
    m.add_function(wrap_pyfunction!(set_disabled, m)?)?;
    m.add_function(wrap_pyfunction!(stop_channel, m)?)?;
    m.add_function(wrap_pyfunction!(apply_directive, m)?)?;
    m.add_function(wrap_pyfunction!(count_error, m)?)?;
    m.add_function(wrap_pyfunction!(render_metrics, m)?)?;
    m.add_function(wrap_pyfunction!(phase_after, m)?)?;
    signals::register(m)?;
    // The entropy kernels (CUDA on the caller's stream, SIMD CPU) as `_native.kernels`.
    let kernels = PyModule::new(m.py(), "kernels")?;
    meridian_kernels::python::register(&kernels)?;
    m.add_submodule(&kernels)?;
    Ok(())
}
