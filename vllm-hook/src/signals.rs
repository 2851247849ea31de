//! Configuration and signal functions exposed to Python: `load_config` (the same strict
//! loader the proxy uses, errors naming the dotted field), top-k entropy bounds and the
//! EAT state, from `meridian-core`. Entropy over logits buffers is `meridian-kernels`
//! (`_native.kernels`).

use std::path::Path;

use meridian_core::config::{EngineFile, Override, load_config as core_load};
use meridian_core::signals::{self, EatConfig};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

/// Loads and validates the hook's sections of a `meridian.toml` (`None`: defaults), with
/// the same `MERIDIAN_SECTION__FIELD` environment overrides as the proxy; the proxy's
/// sections are the proxy's to check. Returns the sections the hook uses as plain dicts;
/// raises `ValueError` naming the dotted field.
#[pyfunction]
#[pyo3(signature = (path=None))]
fn load_config<'py>(py: Python<'py>, path: Option<&str>) -> PyResult<Bound<'py, PyDict>> {
    let overrides = Override::from_env(std::env::vars());
    let (cfg, _models): (EngineFile, _) =
        core_load(path.map(Path::new), &overrides).map_err(|e| PyValueError::new_err(e.to_string()))?;
    let out = PyDict::new(py);
    let hook = PyDict::new(py);
    hook.set_item("listen", &cfg.hook.listen)?;
    hook.set_item("token_env", &cfg.hook.token_env)?;
    hook.set_item("policy", &cfg.hook.policy)?;
    hook.set_item("entropy", cfg.hook.entropy)?;
    hook.set_item("timeout_s", cfg.hook.timeout_s)?;
    hook.set_item("on_unsupported_vllm", cfg.hook.on_unsupported_vllm.as_str())?;
    out.set_item("hook", hook)?;
    let x = &cfg.exit;
    let exit = PyDict::new(py);
    let signal = match x.signal {
        meridian_core::config::ExitSignal::Off => "off",
        meridian_core::config::ExitSignal::Rpdi => "rpdi",
        meridian_core::config::ExitSignal::Eat => "eat",
    };
    exit.set_item("signal", signal)?;
    exit.set_item("min_think_tokens", x.min_think_tokens)?;
    exit.set_item("rpdi_window", x.rpdi_window)?;
    exit.set_item("rpdi_lambda", x.rpdi_lambda)?;
    exit.set_item("eat_alpha", x.eat_alpha)?;
    exit.set_item("eat_delta", x.eat_delta)?;
    exit.set_item("eat_warmup_steps", x.eat_warmup_steps)?;
    exit.set_item("eat_probe_every_tokens", x.eat_probe_every_tokens)?;
    out.set_item("exit", exit)?;
    let budget = PyDict::new(py);
    budget.set_item("think_tokens", cfg.budget.think_tokens)?;
    budget.set_item("per_family", cfg.budget.per_family.clone())?;
    out.set_item("budget", budget)?;
    Ok(out)
}

/// The think delimiters of the model family `served_model` resolves to, as token ids
/// `(start, end)`; `None` when no family matches or it publishes no ids.
/// A family name with its think start and end token ids.
type FamilyMarkers = (String, Vec<u32>, Vec<u32>);

#[pyfunction]
fn family_markers(served_model: &str) -> PyResult<Option<FamilyMarkers>> {
    let models = meridian_core::ModelRegistry::builtin().map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(models.resolve(served_model).and_then(|f| {
        let tags = f.file.tags.as_ref()?;
        (!tags.end_ids.is_empty())
            .then(|| (f.name().to_owned(), tags.start_ids.clone(), tags.end_ids.clone()))
    }))
}

/// `(top_k, lower, upper, residual)`: what top-k logprobs say about the full entropy of
/// a vocabulary of `vocab` tokens.
#[pyfunction]
fn entropy_bounds(logprobs: Vec<f64>, vocab: usize) -> (f64, f64, f64, f64) {
    let b = signals::entropy_from_top_logprobs(&logprobs, vocab);
    (b.top_k, b.lower, b.upper, b.residual)
}

/// EAT state of one request: EMA and EMA variance of probe entropies, with warm-up.
#[pyclass(module = "meridian_hook._native")]
pub struct Eat {
    inner: signals::Eat,
}

#[pymethods]
impl Eat {
    #[new]
    #[pyo3(signature = (alpha=0.2, delta=1e-4, warmup_steps=4))]
    fn new(alpha: f64, delta: f64, warmup_steps: u32) -> PyResult<Self> {
        if !(alpha > 0.0 && alpha <= 1.0) {
            return Err(PyValueError::new_err(format!("exit.eat_alpha must be in (0, 1]; got {alpha}")));
        }
        if !(delta.is_finite() && delta > 0.0) {
            return Err(PyValueError::new_err(format!(
                "exit.eat_delta must be a positive variance; got {delta}"
            )));
        }
        Ok(Eat { inner: signals::Eat::new(EatConfig { alpha, delta, warmup_steps }) })
    }

    /// Takes one probe entropy; returns `(ema, variance, stop)`.
    fn update(&mut self, entropy: f64) -> (f64, f64, bool) {
        let r = self.inner.update(entropy);
        (r.ema, r.variance, r.stop)
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Eat>()?;
    m.add_function(wrap_pyfunction!(load_config, m)?)?;
    m.add_function(wrap_pyfunction!(family_markers, m)?)?;
    m.add_function(wrap_pyfunction!(entropy_bounds, m)?)?;
    Ok(())
}
