//! The `promote` step: registers the model version with its lineage and moves an alias
//! in the registry (`registry.rs`).

// The `promote` step: its `with:` block, registration and what it does with its context.

/// `promote`: registry update.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PromoteConfig {
    /// The registered model's name.
    pub model: String,
    /// The alias to move: `candidate` or `production`.
    pub alias: String,
    /// The registry: an artifact store URL (its object-store registry) or
    /// `mlflow+http://host:port`; default `DRIVETRAIN_REGISTRY`, else the artifact store's.
    #[serde(default)]
    pub registry: Option<String>,
}

/// The step, as the catalog lists it.
pub(crate) fn step() -> Box<dyn drivetrain_engine::step::Step> {
    crate::builtin::builtin::<PromoteConfig>(
        "promote",
        "register the model version with its lineage and move an alias",
        &[("model", true), ("report", false)],
        &["registration"],
        |c, cx| Box::pin(run_step(c, cx)),
    )
    .writing_registry()
    .reporting(&[
        "model",
        "version",
        "registered",
        "alias",
        "from",
        "generation",
    ])
    .boxed()
}

async fn run_step(
    c: PromoteConfig,
    cx: &drivetrain_engine::step::StepContext,
) -> anyhow::Result<serde_json::Value> {
    let model_dir = cx.input("model")?;
    let report: serde_json::Value = match cx.inputs.get("report") {
        Some(d) => serde_json::from_slice(&std::fs::read(d.join("report.json"))?)?,
        None => serde_json::Value::Null,
    };
    let reg = crate::registry::Registry::open_for(c.registry.as_deref(), &cx.store)?;
    let meta = serde_json::json!({
        "source": {"model_digest": cx.input_digests.get("model"), "run": cx.run_id, "pipeline": cx.pipeline, "stage": cx.stage},
        "lineage": report.get("lineage").cloned().unwrap_or(serde_json::Value::Null),
        "metrics": report.pointer("/metrics/candidate").cloned().unwrap_or(serde_json::Value::Null),
    });
    let (version, registered) = reg.register_once(&c.model, model_dir, meta).await?;
    // The approvals that passed upstream in this run (`DRIVETRAIN_APPROVALS`, set by the
    // engine for steps that write the registry): who decided, with the gate, is why.
    let approvals: serde_json::Value = std::env::var("DRIVETRAIN_APPROVALS")
        .ok()
        .and_then(|a| serde_json::from_str(&a).ok())
        .unwrap_or_else(|| serde_json::json!([]));
    let note = serde_json::json!({
        "run": cx.run_id,
        "gate": {"passed": report.get("passed"), "reasons": report.get("reasons")},
        "approvals": approvals,
    });
    let entry = reg.move_alias(&c.model, &c.alias, version, note).await?;
    let out = serde_json::json!({"model": c.model, "version": version, "registered": registered, "alias": c.alias, "from": entry["from"], "generation": entry["generation"]});
    std::fs::write(
        cx.output("registration")?.join("registration.json"),
        serde_json::to_vec_pretty(&out)?,
    )?;
    let why = report
        .get("reasons")
        .and_then(serde_json::Value::as_array)
        .map(|r| {
            r.iter()
                .filter_map(serde_json::Value::as_str)
                .collect::<Vec<_>>()
                .join("; ")
        })
        .unwrap_or_default();
    println!(
        "promoted {} version {version} to `{}` (was {}): {why}",
        c.model,
        c.alias,
        entry["from"]
            .as_u64()
            .map(|v| format!("version {v}"))
            .unwrap_or_else(|| "unset".into())
    );
    Ok(out)
}
