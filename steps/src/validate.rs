//! The `validate` step: the candidate model against production on every slice, and a
//! gate over both (`gate.rs`): what decides a promotion.

// The `validate` step: its `with:` block, registration and what it does with its context.

/// `validate`: the promotion gate.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ValidateConfig {
    /// A condition over the metrics of the candidate and of production, e.g.
    /// `candidate.recall.hard_brake >= production.recall.hard_brake and candidate.f1 >= production.f1 - 0.01`.
    pub gate: String,
    /// The registered model whose alias is production, e.g. `risk-model`.
    #[serde(default)]
    pub model: Option<String>,
    /// The alias to compare with. Default `production`.
    #[serde(default)]
    pub baseline: Option<String>,
    /// Where the production model is registered (as `promote`'s `registry`).
    #[serde(default)]
    pub registry: Option<String>,
}

/// The step, as the catalog lists it.
pub(crate) fn step() -> Box<dyn drivetrain_engine::step::Step> {
    crate::builtin::builtin::<ValidateConfig>(
        "validate",
        "the candidate against production on every slice, against a gate",
        &[
            ("model", true),
            ("dataset", true),
            ("corner_cases", false),
            ("baseline", false),
        ],
        &["report"],
        |c, cx| Box::pin(run_step(c, cx)),
    )
    .checked(|c| match crate::gate::parse(&c.gate) {
        Ok(_) => Vec::new(),
        Err(e) => vec![("gate".to_owned(), format!("gate: {e}"))],
    })
    .reading(validate_reads)
    .reporting(&["passed", "reasons", "metrics"])
    .boxed()
}

/// `validate` compares with the model an alias points at, unless a `baseline` input
/// gives it: that alias is part of its cache key.
fn validate_reads(config: &serde_json::Value, inputs: &[&str]) -> Vec<String> {
    let model = config.get("model").and_then(serde_json::Value::as_str);
    let Some(model) = model.filter(|_| !inputs.contains(&"baseline")) else {
        return Vec::new();
    };
    let alias = config
        .get("baseline")
        .and_then(serde_json::Value::as_str)
        .unwrap_or("production");
    let registry = config.get("registry").and_then(serde_json::Value::as_str);
    vec![crate::registry::reference(model, alias, registry)]
}

async fn run_step(
    c: ValidateConfig,
    cx: &drivetrain_engine::step::StepContext,
) -> anyhow::Result<serde_json::Value> {
    let gate = crate::gate::parse(&c.gate).map_err(|e| anyhow::anyhow!("gate: {e}"))?;
    let candidate = crate::model::load(&std::fs::read(cx.input("model")?.join("model.json"))?)?;
    let dataset = cx.input("dataset")?;
    let mut val = crate::table::split(dataset, "val").await?;
    if val.is_empty() {
        eprintln!("warning: the validation split is empty; validating on the test split");
        val = crate::table::split(dataset, "test").await?;
    }
    let alias = c.baseline.clone().unwrap_or_else(|| "production".into());
    // Production: a `baseline` input, else the registry's alias.
    let (production, production_ref) = match (cx.inputs.get("baseline"), &c.model) {
        (Some(dir), _) => (
            Some(crate::model::load(&std::fs::read(dir.join("model.json"))?)?),
            serde_json::json!({"input": "baseline"}),
        ),
        (None, Some(name)) => {
            let reg = crate::registry::Registry::open_for(c.registry.as_deref(), &cx.store)?;
            match reg.alias(name, &alias).await? {
                Some(a) => {
                    let n = a["version"].as_u64().unwrap_or_default();
                    (
                        Some(crate::model::load(&reg.file(name, n, "model.json").await?)?),
                        serde_json::json!({"model": name, "alias": alias, "version": n}),
                    )
                }
                None => (None, serde_json::Value::Null),
            }
        }
        (None, None) => (None, serde_json::Value::Null),
    };
    let cand = crate::model::evaluate(&candidate, &val);
    let (passed, reasons) = match &production {
        Some(p) => {
            let prod = crate::model::evaluate(p, &val);
            let (ok, mut why) = crate::gate::evaluate(
                &gate,
                &serde_json::json!({"candidate": cand, "production": prod}),
            );
            why.insert(
                0,
                format!("gate `{}` {}", c.gate, if ok { "passed" } else { "failed" }),
            );
            (ok, why)
        }
        None => (
            true,
            vec![format!("no {alias} model yet: the candidate is the first")],
        ),
    };
    let metrics = serde_json::json!({
        "candidate": cand,
        "production": production.as_ref().map(|p| crate::model::evaluate(p, &val)),
    });
    let report = serde_json::json!({
        "passed": passed,
        "reasons": reasons,
        "metrics": metrics,
        "production": production_ref,
        "lineage": {"inputs": cx.input_digests, "run": cx.run_id, "pipeline": cx.pipeline},
    });
    std::fs::write(
        cx.output("report")?.join("report.json"),
        serde_json::to_vec_pretty(&report)?,
    )?;
    println!(
        "{}: {}",
        if passed { "PASSED" } else { "FAILED" },
        reasons.join("; ")
    );
    Ok(serde_json::json!({"passed": passed, "reasons": reasons, "metrics": metrics}))
}
