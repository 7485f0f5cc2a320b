//! `drivetrain doctor`: what this machine offers local runs — cores, GPUs (and how they
//! were found), and each layer of a local stage's containment: active here or not.

use std::process::ExitCode;

use serde_json::json;

/// Prints the machine's report, as text or JSON.
pub fn doctor(gpus: Option<usize>, json_out: bool) -> anyhow::Result<ExitCode> {
    let cores = crate::runs::default_parallelism();
    let found = drivetrain_executors::gpus::detect(gpus);
    let isolation = drivetrain_executors::local::namespaces_work();
    let layers = drivetrain_executors::local::layers();
    if json_out {
        let list: Vec<_> = found
            .gpus
            .iter()
            .map(|g| json!({"id": g.id, "name": g.name}))
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "cores": cores,
                "gpus": list,
                "gpus_from": found.source,
                "isolation": isolation,
                "layers": layers
                    .iter()
                    .map(|(name, active, what)| json!({"layer": name, "active": active, "what": what}))
                    .collect::<Vec<_>>(),
            }))?
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!("cores: {cores} (the default --parallelism)");
    match found.gpus.len() {
        0 => println!(
            "gpus: none (no NVML, no nvidia-smi, or CUDA_VISIBLE_DEVICES hides them); \
             stages asking for one cannot run here"
        ),
        n => {
            println!("gpus: {n} from {}", found.source);
            for g in &found.gpus {
                println!("  {} {}", g.id, g.name.as_deref().unwrap_or(""));
            }
        }
    }
    println!(
        "isolation: {}",
        match isolation {
            true => "each attempt gets a private mount namespace (store and inputs read-only)",
            false => "no mount namespaces here: inputs are checked after each attempt instead",
        }
    );
    for (name, active, what) in &layers {
        println!(
            "  {:<18} {:<3} {what}",
            name,
            if *active { "yes" } else { "no" }
        );
    }
    Ok(ExitCode::SUCCESS)
}
