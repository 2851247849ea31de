//! `meridian-sim calibrate`: the cost model fitted to a real engine's step trace (exact)
//! or to a load test's report (inferred from token arrival times), printed, and written
//! as a twin profile for `--profile-file`.

use meridian_sim::calibrate as fit_model;
use meridian_sim::spread::{PROBABILITIES, StepSpread};

use crate::cli::CalibrateArgs;

fn read(path: &std::path::Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// `meridian-sim calibrate`: fit the cost model, print it and the profile it makes, and
/// write what was asked for (the fit and curve as JSON, the curve's plot, the profile).
pub fn calibrate(args: CalibrateArgs) -> Result<(), String> {
    let CalibrateArgs {
        report,
        steps,
        json,
        plot,
        curve_window: curve_windows,
        no_floor,
        profile_out,
        no_spread,
        limits,
    } = args;
    let (source, samples, trace) = match (&report, &steps) {
        (_, Some(path)) => {
            let trace = fit_model::read_step_trace(&read(path)?).map_err(|e| e.to_string())?;
            (path, fit_model::samples_from_steps(&trace), Some(trace))
        }
        (Some(path), None) => {
            (path, fit_model::samples_from_report(&read(path)?).map_err(|e| e.to_string())?, None)
        }
        (None, None) => return Err("calibrate needs a load-test report or --steps".into()),
    };
    let fit = if no_floor { fit_model::fit_without_floor(&samples) } else { fit_model::fit(&samples) }
        .map_err(|e| e.to_string())?;
    println!("# fitted from {} samples in {}", fit.samples, source.display());
    println!("# fit error: median |error| {:.1}%, R^2 {:.3}", fit.median_abs_pct_error, fit.r_squared);
    println!("# {}", fit.cost.describe());
    // How the steps spread around the fit, from a step trace only: times inferred from a
    // report's token arrivals carry the delivery path's jitter as well as the engine's.
    let spread = if trace.is_some() && !no_spread {
        let pairs = samples.iter().map(|s| (s.seconds, fit.cost.step_seconds(&s.shape)));
        Some(StepSpread::of(pairs).map_err(|e| e.to_string())?)
    } else {
        None
    };
    if let Some(spread) = &spread {
        let q = |p: f64| spread.factor_at(p);
        println!(
            "# steps over the fit: median {:.2}, p90 {:.2}, p99 {:.2}, mean {:.2}",
            q(0.5),
            q(0.9),
            q(0.99),
            spread.mean()
        );
    }
    let c = &fit.cost;
    let spread_line = spread.as_ref().map_or(String::new(), |s| {
        let q: Vec<String> = s.quantiles().iter().map(|v| format!("{v:.4}")).collect();
        format!("step_spread = [{}]\n", q.join(", "))
    });
    let toml = format!(
        "[[profile]]\nname = {:?}\ngpu = {:?}\nmodel = {:?}\nfixed_s = {:e}\nper_token_s = {:e}\nper_context_token_s = {:e}\nper_decode_request_s = {:e}\nper_prefill_attention_s = {:e}\nweight_read_tokens = {}\nkv_blocks = {}\nblock_size = {}\nmax_num_seqs = {}\nmax_num_batched_tokens = {}\n{spread_line}derivation = {:?}\n",
        limits.name,
        limits.gpu,
        limits.model,
        c.fixed_s,
        c.per_token_s,
        c.per_context_token_s,
        c.per_decode_request_s,
        c.per_prefill_attention_s,
        c.weight_read_tokens,
        limits.kv_blocks,
        limits.block_size,
        limits.max_num_seqs,
        limits.max_num_batched_tokens,
        format!(
            "meridian-sim calibrate on {} ({} samples): median |error| {:.1}%, R^2 {:.3}",
            source.display(),
            fit.samples,
            fit.median_abs_pct_error,
            fit.r_squared
        ),
    );
    println!("{toml}");
    if let Some(path) = &profile_out {
        std::fs::write(path, &toml).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let curve = trace.as_deref().map(|steps| {
        if curve_windows.is_empty() {
            return fit_model::StepCurve::of(steps);
        }
        let inside: Vec<_> = steps
            .iter()
            .filter(|s| curve_windows.iter().any(|&(t0, t1)| (t0..=t1).contains(&s.t)))
            .cloned()
            .collect();
        fit_model::StepCurve::of(&inside)
    });
    if let Some(path) = &json {
        let out = serde_json::json!({
            "fit": {
                "samples": fit.samples,
                "median_abs_pct_error": fit.median_abs_pct_error,
                "r_squared": fit.r_squared,
                "formula": fit.cost.describe(),
            },
            "spread": spread.as_ref().map(|s| serde_json::json!({
                "probabilities": PROBABILITIES,
                "quantiles": s.quantiles(),
                "mean": s.mean(),
            })),
            "curve": curve.as_ref().map(|c| c.to_json(&fit.cost)),
            // Over every step whatever the window: for comparing two engines' traces.
            "curve_all": trace.as_deref().map(|t| fit_model::StepCurve::of(t).to_json(&fit.cost)),
        });
        std::fs::write(path, out.to_string()).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if let (Some(path), Some(curve)) = (&plot, &curve) {
        std::fs::write(path, curve.plot(&fit.cost)).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}
